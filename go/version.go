package dlock

// Version is this client's version: the module's, the same for every dlock client
// (scripts/versions.sh checks it).
const Version = "0.2.0"
