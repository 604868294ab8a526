"""Request policy over the engine: what the proxy does to one request.

``exchange`` serves the proxy port (access, targets, routes, the body, the mode's pipeline,
forwarding, discovery's answer), ``pipeline`` signs (agent mode) and ``relay`` verifies and stacks a
label (relay mode), ``requester`` injects the Requester into exchange calls, ``connect`` decides
CONNECT (intercept or tunnel), ``discovery`` follows 403 + X-Content-Rules. Each is given the
narrow callables it uses (``fetch``, ``prepare``, ``count``), never the app.
"""
