// An S3-compatible server for ferry's tests: s3rver, which checks every signed request's
// SigV4 signature against the secret of its access key and refuses a wrong one (403
// SignatureDoesNotMatch), as a real store does. The bucket is private: a read without a
// signature is refused (403 AccessDenied); uploads (PUT) need none, so that the tests can
// put their objects with a plain HTTP client.
//   node testing/s3rver/serve.js DIR BUCKET ACCESS_KEY_ID:SECRET...
// Stores its objects under DIR, creates BUCKET, accepts each key pair given, and prints
// "PORT <n>" once it listens on 127.0.0.1 (an unused port). Runs until killed.
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
const server = http.createServer((request, response) => {
  if (request.method !== 'PUT' && !('authorization' in request.headers)) {
    const body = '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>' +
      '<Message>Access Denied</Message></Error>';
    response.writeHead(403, { 'Content-Type': 'application/xml', 'Content-Length': body.length });
    response.end(request.method === 'HEAD' ? undefined : body);
    return;
  }
  app(request, response);
});
s3rver
  .configureBuckets()
  .then(() => new Promise((resolve) => server.listen(0, '127.0.0.1', resolve)))
  .then(() => console.log(`PORT ${server.address().port}`))
  .catch((error) => {
    console.error(`s3rver: ${error.message}`);
    process.exit(1);
  });
