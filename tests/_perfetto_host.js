// Runs the Perfetto UI's trace processor (engine_bundle.js + trace_processor.wasm from a
// web_dist directory) under Node, set up as the UI's Web Worker sets it up, and joins its RPC
// channel to this process's pipes:
//   stdin  -> the bytes of TraceProcessorRpcStream requests, passed on as they arrive (the
//             engine frames the stream itself, as it does for the UI's postMessage calls);
//   stdout <- the engine's replies, byte for byte;
//   stderr <- everything the engine prints.
// usage: node _perfetto_host.js WEB_DIST_VERSION_DIR
'use strict';
const fs = require('fs');
const path = require('path');

const dir = path.resolve(process.argv[2]);
const log = (...parts) => process.stderr.write(parts.join(' ') + '\n');
// stdout carries replies only.
console.log = log;
console.info = log;
console.warn = log;
console.error = log;

// The bundle's emscripten glue was built for browsers and workers: present a worker whose
// synchronous XMLHttpRequest reads files from dir (only the .wasm is ever asked for).
globalThis.self = globalThis;
globalThis.WorkerGlobalScope = function WorkerGlobalScope() {};
globalThis.location = {href: 'file://' + path.join(dir, 'engine_bundle.js'), protocol: 'file:'};
process.type = 'renderer'; // the glue's test for "not Node"
globalThis.XMLHttpRequest = class {
  open(method, url) {
    this.file = path.join(dir, path.basename(String(url)));
  }
  send() {
    const data = fs.readFileSync(this.file);
    this.response = data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
    this.status = 200;
  }
};

require(path.join(dir, 'engine_bundle.js'));
if (typeof self.onmessage !== 'function') {
  log('engine_bundle.js did not install a worker message handler');
  process.exit(3);
}

// The UI hands the worker a MessagePort; this one writes to stdout.
const port = {
  onmessage: null,
  postMessage(bytes) {
    process.stdout.write(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength));
  },
};
self.onmessage({data: port});

// The wasm is compiled synchronously while the bundle loads; the bridge finishes its RPC setup
// in a promise callback, so requests wait for one turn of the event loop.
const early = [];
let ready = false;
process.stdin.on('data', (chunk) => {
  if (ready) port.onmessage({data: new Uint8Array(chunk)});
  else early.push(chunk);
});
process.stdin.on('end', () => process.exit(0));
setImmediate(() => {
  ready = true;
  for (const chunk of early.splice(0)) port.onmessage({data: new Uint8Array(chunk)});
});
