// Checks signed requests read from stdin with Cloudflare's verifiers and prints the verdicts as JSON.
// Started by tests/proxy/test_web_bot_auth_node.py with
//   {"keys": {"<keyid>": <public JWK>}, "cases": {"<name>": {"url", "method", "headers", "now",
//    "labels": {"<label>": [["@authority", null], ["signature-agent", "<member key>"], ...]}}}}
// For each case: "web_bot_auth", the web-bot-auth package's `verify` (one label only; the clock is
// the real one), and "http_message_sig", per label, Cloudflare's http-message-sig 0.3
// `verifySignature` of that label under the web-bot-auth policy (its required components, created,
// expires, keyid, tag="web-bot-auth"; the clock is "now"). A verdict is "ok" or "refused: <why>".
import fs from "node:fs";
import { verify } from "web-bot-auth";
import { verifierFromJWK } from "web-bot-auth/crypto";
import { component, verifySignature, webcrypto } from "http-message-sig-0.3";

const { keys, cases } = JSON.parse(fs.readFileSync(0, "utf8"));

async function verdict(check) {
  try {
    await check();
    return "ok";
  } catch (error) {
    return `refused: ${error.message}`;
  }
}

async function webcryptoKey(keyid) {
  const jwk = keys[keyid];
  if (jwk === undefined) throw new Error(`no key for keyid ${keyid}`);
  const key = await crypto.subtle.importKey("jwk", { kty: jwk.kty, crv: jwk.crv, x: jwk.x }, { name: "Ed25519" }, true, ["verify"]);
  return webcrypto.verifier(key);
}

const out = {};
for (const [name, c] of Object.entries(cases)) {
  const request = () => new Request(c.url, { method: c.method, headers: c.headers });
  const result = {};
  result.web_bot_auth = await verdict(async () => {
    const keyid = Object.keys(keys).find((k) => (c.headers["signature-input"] || "").includes(`keyid="${k}"`));
    await verify(request(), await verifierFromJWK(keys[keyid] ?? Object.values(keys)[0]));
  });
  result.http_message_sig = {};
  for (const [label, required] of Object.entries(c.labels)) {
    result.http_message_sig[label] = await verdict(async () => {
      const verified = await verifySignature(request(), {
        label,
        policy: {
          algorithms: ["ed25519"],
          requiredComponents: required.map(([id, key]) => (key === null ? id : component(id, { key }))),
          requiredParameters: ["created", "expires", "keyid", "tag"],
          maxAge: 86400,
          clockSkew: 5,
          now: c.now,
        },
        resolveVerifier: (candidate) => webcryptoKey(candidate.parameters.keyid),
      });
      if (verified.parameters.tag !== "web-bot-auth") throw new Error("tag must be web-bot-auth");
    });
  }
  out[name] = result;
}
console.log(JSON.stringify(out));
