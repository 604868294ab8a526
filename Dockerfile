# signing-proxy: a sidecar (or relay) container. Build: docker build -t signing-proxy .
# Keys come from a mounted Secret (read-only), state lives in the /var/lib/signing-proxy volume.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY signing_proxy ./signing_proxy
COPY docker/install.sh /usr/local/bin/install-signing-proxy
RUN install-signing-proxy /opt/signing-proxy /src

FROM python:3.11-slim
RUN groupadd --system --gid 10001 signing-proxy \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/signing-proxy --shell /usr/sbin/nologin signing-proxy \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/signing-proxy
COPY --from=build /opt/signing-proxy /opt/signing-proxy
COPY config/sidecar.yaml /etc/signing-proxy/config.yaml
ENV PATH=/opt/signing-proxy/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    SIGNING_PROXY_DATA_DIR=/var/lib/signing-proxy
USER 10001:10001
VOLUME ["/var/lib/signing-proxy"]
EXPOSE 8080
EXPOSE 9090
# the admin port (config/sidecar.yaml: admin.listen, loopback in admin.allow_clients): the proxy port
# answers access.allow_clients only, which a deployment narrows (SIGNING_PROXY_ALLOW_CLIENTS)
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9090/healthz', timeout=2)"]
ENTRYPOINT ["signing-proxy"]
CMD ["run", "--config", "/etc/signing-proxy/config.yaml"]
