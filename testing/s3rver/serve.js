// An S3-compatible server for ferry's tests: s3rver, which checks every signed request's
// SigV4 signature against the secret of its access key and refuses a wrong one (403
// SignatureDoesNotMatch), as a real store does. The bucket is private: a read without a
// signature is refused (403 AccessDenied); uploads (PUT) need none, so that the tests can
// put their objects with a plain HTTP client.
//   node --openssl-legacy-provider testing/s3rver/serve.js DIR BUCKET ACCESS_KEY_ID:SECRET...
// (s3rver makes ListObjectsV2's continuation tokens with DES, which OpenSSL 3 keeps in its
// legacy provider: without it every listing of more than one page fails, 500 InternalError.)
// Stores its objects under DIR, creates BUCKET, accepts each key pair given, and prints
// "PORT <n>" once it listens on 127.0.0.1 (an unused port). Runs until killed.
// S3RVER_GATHER=N holds the first GETs of objects until N of them are in flight together
// (or 10 s passed), so that a test sees a client's parallelism whatever the machine's load;
// GET /__stats answers {"most_gets_at_once": ..., "gets": [the path of every object GET, in
// the order they came], "ranges": [each GET's path and Range header, "PATH bytes=A-B"],
// "heads": [the same of every HEAD]}.
// S3RVER_HOLD=TEXT holds every GET of an object whose path holds TEXT until GET /__release
// (which answers {} and serves them, and every later one at once): a test sees what its
// client does while those objects have not arrived.
// S3RVER_STALL_FIRST=TEXT: the first GET of each object whose path holds TEXT sends 4 KiB
// and then nothing more, never ending (a transfer a test kills its client in).
// S3RVER_CUT_FIRST=TEXT: the first GET of each object whose path holds TEXT that is
// answered (not refused 503) is cut after its first 4 KiB (the connection closed).
// S3RVER_LIST_ONLY=ACCESS_KEY_ID: that key may list the bucket but not read its objects
// (403 AccessDenied), as an IAM policy with s3:ListBucket and no s3:GetObject allows.
// S3RVER_PUBLIC=1 serves unsigned reads too (a public bucket: benchmarks compare ferry
// with a plain HTTP client). S3RVER_MB_PER_S=R sends the bodies of GETs through one link of
// R MB/s that every connection shares, as a store behind a network of that bandwidth (each
// answer's bytes wait for the link in the order they are written; benchmarks measure a
// store slower than this machine's loopback).
// S3RVER_FLAKY=1 makes it a store having a bad day, the same whatever the order in which
// concurrent requests arrive: the first attempt of every read (a HEAD, a listing page, a GET
// of one range) is answered 503 SlowDown, and the first GET of each object that is answered
// is cut after its first 4 KiB (the connection closed mid-body). A client that retries a
// refused request and resumes a cut transfer from its last byte reads every object within
// 4 attempts a request.
'use strict';

const http = require('http');
const S3rver = require('@20minutes/s3rver');
const { DUMMY_ACCOUNT } = require('@20minutes/s3rver/lib/models/account');

const [dir, bucket, ...pairs] = process.argv.slice(2);
if (!dir || !bucket) {
  console.error('usage: serve.js DIR BUCKET [ACCESS_KEY_ID:SECRET]...');
  process.exit(2);
}
for (const pair of pairs) {
  const colon = pair.indexOf(':');
  DUMMY_ACCOUNT.createKeyPair(pair.slice(0, colon), pair.slice(colon + 1));
}
const s3rver = new S3rver({
  silent: true,
  directory: dir,
  configureBuckets: [{ name: bucket, configs: [] }],
});
const app = s3rver.callback();
const flaky = process.env.S3RVER_FLAKY === '1';
const publicReads = process.env.S3RVER_PUBLIC === '1';
const gather = Number(process.env.S3RVER_GATHER || 0);
let gets = 0;
let mostGets = 0;
const getLog = [];
const rangeLog = [];
const headLog = [];
let gathered = gather <= 1;
const held = [];
function releaseHeld() {
  gathered = true;
  held.splice(0).forEach((run) => run());
}
const stallFirst = process.env.S3RVER_STALL_FIRST || '';
const cutFirst = process.env.S3RVER_CUT_FIRST || '';
const cut = new Set();
// Closes the connection once more than 4 KiB of the answer's body was written.
function cutAfter4KiB(response) {
  let sent = 0;
  const write = response.write.bind(response);
  response.write = (chunk, ...rest) => {
    sent += chunk.length;
    if (sent > 4096) {
      response.socket.destroy();
      return false;
    }
    return write(chunk, ...rest);
  };
}
// The shared link of S3RVER_MB_PER_S: when it is free again (ms), and an answer's bytes
// queued on it in order, each answer's end after its last byte.
const bytesPerMs = Number(process.env.S3RVER_MB_PER_S || 0) * 1000;
let linkFree = 0;
function throughLink(response) {
  const write = response.write.bind(response);
  const end = response.end.bind(response);
  // This answer's steps (writes, then its end), each run once the link has carried the
  // bytes before it, one at a time and in order.
  const steps = [];
  let busy = false;
  const pump = () => {
    if (busy || steps.length === 0) return;
    busy = true;
    const step = steps.shift();
    setTimeout(() => {
      step.run();
      busy = false;
      pump();
    }, Math.max(0, step.at - Date.now()));
  };
  let last = 0;  // when this answer's bytes queued so far have left the link
  response.write = (chunk, encoding, callback) => {
    if (typeof encoding === 'function') [callback, encoding] = [encoding, undefined];
    const bytes = typeof chunk === 'string' ? Buffer.from(chunk, encoding) : chunk;
    linkFree = Math.max(Date.now(), linkFree) + bytes.length / bytesPerMs;
    last = linkFree;
    steps.push({ at: last, run: () => {
      write(bytes, callback);
      response.emit('drain');
    } });
    pump();
    return false;  // the writer waits for 'drain', as on a slow socket
  };
  response.end = (chunk, encoding, callback) => {
    if (typeof chunk === 'function') [callback, chunk] = [chunk, undefined];
    if (typeof encoding === 'function') [callback, encoding] = [encoding, undefined];
    if (chunk) response.write(chunk, encoding);
    steps.push({ at: last, run: () => end(callback) });
    pump();
    return response;
  };
}
const hold = process.env.S3RVER_HOLD || '';
let holding = hold !== '';
const waiting = [];
const listOnly = process.env.S3RVER_LIST_ONLY || '';
const stalled = new Set();
const refusedOnce = new Set();  // "METHOD URL RANGE" of each read refused (S3RVER_FLAKY)
const server = http.createServer((request, response) => {
  if (request.url === '/__stats') {
    response.writeHead(200, { 'Content-Type': 'application/json' });
    response.end(JSON.stringify({
      most_gets_at_once: mostGets, gets: getLog, ranges: rangeLog, heads: headLog,
    }));
    return;
  }
  if (request.url === '/__release') {
    holding = false;
    waiting.splice(0).forEach((run) => run());
    response.writeHead(200, { 'Content-Type': 'application/json' });
    response.end('{}');
    return;
  }
  if (request.method === 'HEAD') headLog.push(request.url.split('?')[0]);
  if (request.method === 'GET' && !request.url.includes('list-type')) {
    gets += 1;
    mostGets = Math.max(mostGets, gets);
    getLog.push(request.url.split('?')[0]);
    rangeLog.push(`${request.url.split('?')[0]} ${request.headers.range || ''}`);
    response.on('close', () => {
      gets -= 1;
    });
    if (holding && request.url.includes(hold)) {
      waiting.push(() => serve(request, response));
      return;
    }
    if (!gathered) {
      if (gets >= gather) {
        releaseHeld();
      } else {
        const timer = setTimeout(releaseHeld, 10000);
        held.push(() => {
          clearTimeout(timer);
          serve(request, response);
        });
        return;
      }
    }
  }
  serve(request, response);
});

function serve(request, response) {
  if (bytesPerMs > 0 && request.method === 'GET' && !request.url.includes('list-type')) {
    throughLink(response);
  }
  if (stallFirst && request.method === 'GET' && request.url.includes(stallFirst) &&
      !stalled.has(request.url)) {
    stalled.add(request.url);
    let sent = 0;
    const write = response.write.bind(response);
    response.write = (chunk, ...rest) => {
      const part = chunk.subarray(0, Math.max(0, 4096 - sent));
      sent += part.length;
      if (part.length > 0) write(part, ...rest);
      return false;  // no 'drain' follows: the transfer stalls here
    };
    response.end = () => response;  // and never ends
  }
  if (flaky && request.method !== 'PUT') {
    const attempt = `${request.method} ${request.url} ${request.headers.range || ''}`;
    if (!refusedOnce.has(attempt)) {
      refusedOnce.add(attempt);
      const body = '<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>';
      response.writeHead(503, { 'Content-Type': 'application/xml', 'Content-Length': body.length });
      response.end(request.method === 'HEAD' ? undefined : body);
      return;
    }
  }
  // Cuts the first answered GET of each object S3RVER_CUT_FIRST names (every object's when
  // the store is flaky).
  const cutThis = flaky ? !request.url.includes('list-type') : request.url.includes(cutFirst);
  if ((flaky || cutFirst) && request.method === 'GET' && cutThis && !cut.has(request.url)) {
    cut.add(request.url);
    cutAfter4KiB(response);
  }
  const refused = listOnly && request.method !== 'PUT' && !request.url.includes('list-type') &&
    (request.headers.authorization || '').includes(`Credential=${listOnly}/`);
  if (refused ||
      (!publicReads && request.method !== 'PUT' && !('authorization' in request.headers))) {
    const body = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>' +
      '<Message>Access Denied</Message></Error>';
    response.writeHead(403, { 'Content-Type': 'application/xml', 'Content-Length': body.length });
    response.end(request.method === 'HEAD' ? undefined : body);
    return;
  }
  app(request, response);
}
s3rver
  .configureBuckets()
  .then(() => new Promise((resolve) => server.listen(0, '127.0.0.1', resolve)))
  .then(() => console.log(`PORT ${server.address().port}`))
  .catch((error) => {
    console.error(`s3rver: ${error.message}`);
    process.exit(1);
  });
