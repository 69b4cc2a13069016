"""HTTP to the servers and to etcd's JSON gateway, and Prometheus text pages."""

import http.client
import urllib.parse


def host_port(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port


def call(url, method="GET", path="/", headers=None, body=None, timeout=10):
    """One request on a new connection: (status, {header: value}, body)."""
    host, port = host_port(url)
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        c.close()


class Conn:
    """A kept-alive HTTP/1.1 connection that reconnects when the server closed it."""

    def __init__(self, url, timeout=10):
        self.host, self.port = host_port(url)
        self.timeout = timeout
        self.c = None

    def request(self, method, path, headers=None, body=None):
        for attempt in (0, 1):
            if self.c is None:
                self.c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self.c.request(method, path, body=body, headers=headers or {})
                r = self.c.getresponse()
                data = r.read()
                if r.will_close:
                    self.c.close()
                    self.c = None
                return r.status, data
            except (http.client.HTTPException, OSError):
                self.c.close()
                self.c = None
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self):
        if self.c is not None:
            self.c.close()
            self.c = None


def metric_sum(page, name):
    """The sum of every series of one metric in a Prometheus text page."""
    total = 0.0
    for line in page.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            rest = line[len(name):]
            if rest.startswith("{"):
                rest = rest[rest.rfind("}") + 1:]
            total += float(rest.split()[0])
    return total
