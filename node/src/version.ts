/** This client's version: the module's, the same for every dlock client (scripts/versions.sh checks it). */
export const VERSION = "0.2.0";
