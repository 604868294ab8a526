// Checks a signed key directory response with Cloudflare's http-message-sig 0.3 under the directory
// draft's rules: Content-Digest over the body, and for every published key a label whose proof
// covers "@authority";req and content-digest with created, expires, keyid and
// tag="http-message-signatures-directory". Prints {"<keyid>": "ok" | "refused: …"} as JSON.
//   node wba_directory.mjs <URL to fetch> <authority the client asked for> [--tamper]
import { createHash } from "node:crypto";
import { component, verifySignature, webcrypto } from "http-message-sig-0.3";

const [url, authority, tamper] = process.argv.slice(2);
const response = await fetch(url, { headers: { accept: "application/http-message-signatures-directory+json" } });
let body = Buffer.from(await response.arrayBuffer());
if (tamper === "--tamper") {
  const doc = JSON.parse(body.toString());
  doc.keys[0].use = "enc"; // the same keys, a body changed on the way
  body = Buffer.from(JSON.stringify(doc));
}
const keys = JSON.parse(body.toString()).keys;
const fields = [];
response.headers.forEach((value, name) => fields.push({ name, value }));
const digestOk = response.headers.get("content-digest") === `sha-256=:${createHash("sha256").update(body).digest("base64")}:`;
const labels = (response.headers.get("signature-input") || "").split(/,\s*(?=[a-z*][a-z0-9_.*-]*=\()/).map((m) => m.split("=", 1)[0]);
const message = {
  kind: "response",
  status: response.status,
  fields,
  request: { kind: "request", method: "GET", targetUri: `https://${authority}/.well-known/http-message-signatures-directory`, fields: [] },
};
const verdicts = { content_type: response.headers.get("content-type") };
for (const jwk of keys) {
  const thumbprint = await (async () => {
    const canonical = JSON.stringify({ crv: jwk.crv, kty: jwk.kty, x: jwk.x });
    return createHash("sha256").update(canonical).digest("base64url");
  })();
  verdicts[thumbprint] = "refused: no proof";
  if (!digestOk) {
    verdicts[thumbprint] = "refused: content-digest does not match the body";
    continue;
  }
  const key = await crypto.subtle.importKey("jwk", { kty: jwk.kty, crv: jwk.crv, x: jwk.x }, { name: "Ed25519" }, true, ["verify"]);
  for (const label of labels) {
    try {
      const verified = await verifySignature(message, {
        label,
        policy: {
          algorithms: ["ed25519"],
          requiredComponents: [component("@authority", { req: true }), "content-digest"],
          requiredParameters: ["created", "expires", "keyid", "tag"],
          clockSkew: 5,
        },
        resolveVerifier: (candidate) => {
          if (candidate.parameters.keyid !== thumbprint) throw new Error("another key's proof");
          return webcrypto.verifier(key);
        },
      });
      if (verified.parameters.tag !== "http-message-signatures-directory") throw new Error("wrong tag");
      verdicts[thumbprint] = "ok";
      break;
    } catch (error) {
      if (!String(error.message).includes("resolution failed")) verdicts[thumbprint] = `refused: ${error.message}`;
    }
  }
}
console.log(JSON.stringify(verdicts));
