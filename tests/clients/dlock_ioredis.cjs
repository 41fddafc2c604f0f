// dlock's commands from ioredis (tested with 6.1.0), sent with their first argument, the
// resource, as the key: Redis.Cluster then sends each to the primary of the resource's slot.
// ioredis finds keys only in the commands of its own table; any other command (a module's,
// through `call`) goes to a random primary, which answers MOVED, and ioredis refreshes its
// slot map.
const Redis = require("ioredis");

class DlockCommand extends Redis.Command {
  getKeys() {
    return [this.args[0]];
  }
}

/// Like client.call(name, ...args), for a Redis or a Redis.Cluster, routed by the resource:
/// dlock(cluster, "DLOCK.ACQUIRE", "invoice:{123}", token, 30000)
function dlock(client, name, ...args) {
  return client.sendCommand(new DlockCommand(name, args, { replyEncoding: "utf8" }));
}

module.exports = { dlock };
