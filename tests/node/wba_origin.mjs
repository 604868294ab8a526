// A test origin that checks every request with Cloudflare's web-bot-auth verifiers and answers the
// verdicts as JSON. Started by tests/proxy/test_web_bot_auth_node.py; prints "listening <port>".
//   node wba_origin.mjs '<public JWK>' [cert.pem key.pem]
// Two verifiers: the web-bot-auth package's `verify` (tag, created, expires, keyid, signature), and
// Cloudflare's http-message-sig 0.3 `verifySignature` with the web-bot-auth policy (the 0.2 library
// under web-bot-auth 0.1.3 puts a whole Dictionary field in the base for a `;key=` component).
import fs from "node:fs";
import http from "node:http";
import https from "node:https";
import { verify } from "web-bot-auth";
import { verifierFromJWK } from "web-bot-auth/crypto";
import { component, verifySignature, webcrypto } from "http-message-sig-0.3";

const [jwkText, certFile, keyFile] = process.argv.slice(2);
const jwk = JSON.parse(jwkText);
const scheme = certFile ? "https" : "http";

async function webBotAuth(url, method, headers) {
  const request = new Request(url, { method, headers });
  const check = await verifierFromJWK(jwk);
  await verify(request, check);
  return "ok";
}

async function httpMessageSig(url, method, headers) {
  const key = await crypto.subtle.importKey("jwk", { kty: jwk.kty, crv: jwk.crv, x: jwk.x }, { name: "Ed25519" }, true, ["verify"]);
  const agentLabel = (headers["signature-input"] || "").split("=", 1)[0];
  const required = ["@authority"];
  if (headers["signature-agent"] !== undefined && /^[a-z*][a-z0-9_.*-]*=/.test(headers["signature-agent"])) {
    required.push(component("signature-agent", { key: agentLabel }));
  }
  const verified = await verifySignature(new Request(url, { method, headers }), {
    policy: {
      algorithms: ["ed25519"],
      requiredComponents: required,
      requiredParameters: ["created", "expires", "keyid", "tag"],
      maxAge: 86400,
      clockSkew: 5,
    },
    resolveVerifier: () => webcrypto.verifier(key),
  });
  if (verified.parameters.tag !== "web-bot-auth") throw new Error("tag must be web-bot-auth");
  return "ok";
}

async function handle(req, res) {
  const headers = {};
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    const name = req.rawHeaders[i].toLowerCase();
    headers[name] = name in headers ? `${headers[name]}, ${req.rawHeaders[i + 1]}` : req.rawHeaders[i + 1];
  }
  const url = `${scheme}://${req.headers.host}${req.url}`;
  const verdict = { url, headers };
  for (const [name, check] of [["web_bot_auth", webBotAuth], ["http_message_sig", httpMessageSig]]) {
    try {
      verdict[name] = await check(url, req.method, headers);
    } catch (error) {
      verdict[name] = `refused: ${error.message}`;
    }
  }
  const body = JSON.stringify(verdict);
  res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
}

const server = certFile
  ? https.createServer({ cert: fs.readFileSync(certFile), key: fs.readFileSync(keyFile) }, (q, s) => void handle(q, s))
  : http.createServer((q, s) => void handle(q, s));
server.listen(0, "127.0.0.1", () => {
  console.log(`listening ${server.address().port}`);
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
