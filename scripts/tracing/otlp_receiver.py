#!/usr/bin/env python3
"""A minimal OTLP/HTTP trace receiver for the tests: decodes what a server exports with the
`opentelemetry-proto` package (the collector protocol's own message types) and prints one
JSON line per span on stdout.

    otlp_receiver.py [--port 0]

Prints `listening on http://127.0.0.1:PORT` first. Takes `POST /v1/traces` in protobuf
(`application/x-protobuf`) or OTLP's JSON (`application/json`: proto3's JSON mapping except
that trace and span ids are hex, as the OTLP specification says, which is turned into the
mapping's base64 before parsing), answers an empty ExportTraceServiceResponse, and refuses
anything that does not decode (400), so a malformed export fails the test that reads this.
Each line: {"trace_id", "span_id", "parent_span_id" (hex, "" for none), "name", "kind",
"start", "end" (Unix ns), "attributes": {key: string value}, "status": code, "resource":
{key: string value}}.
"""
import argparse
import base64
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def hex_ids_to_base64(doc):
    """OTLP/JSON writes ids in hex; proto3's JSON mapping of bytes is base64."""
    for rs in doc.get("resourceSpans", []):
        for ss in rs.get("scopeSpans", []):
            for span in ss.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if span.get(key):
                        span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
    return doc


# Handlers run on threads of their own: one line is printed at a time.
PRINT = threading.Lock()


def emit(doc):
    with PRINT:
        print(json.dumps(doc), flush=True)


def attributes(kvs):
    return {kv.key: kv.value.string_value for kv in kvs}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the http.server API
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        message = ExportTraceServiceRequest()
        try:
            if self.path.rstrip("/") != "/v1/traces":
                raise ValueError(f"unexpected path {self.path}")
            if self.headers.get("content-type", "").startswith("application/json"):
                json_format.Parse(json.dumps(hex_ids_to_base64(json.loads(body))), message)
            else:
                message.ParseFromString(body)
        except Exception as e:  # noqa: BLE001 - any decoding failure is the sender's
            emit({"error": str(e)})
            self.send_response(400)
            self.end_headers()
            return
        for rs in message.resource_spans:
            resource = attributes(rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    emit({
                        "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
                        "parent_span_id": span.parent_span_id.hex(), "name": span.name,
                        "kind": span.kind, "start": span.start_time_unix_nano,
                        "end": span.end_time_unix_nano, "attributes": attributes(span.attributes),
                        "status": span.status.code, "resource": resource})
        reply = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):
        pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
