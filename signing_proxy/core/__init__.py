"""Sans-IO protocol core: the spec's rules as values in, values out.

Signature bases, signing and verifying (RFC 9421 under the spec's profile), Content-Digest, JWK and
thumbprints, key directories and revocation lists, delegation chains, manifests, the Requester.
No sockets, files, clock or event loop: ``now`` is always a parameter, and every refusal is a
``core.errors.ProtocolError`` with a stable reason. Everything above this layer calls it.
"""
