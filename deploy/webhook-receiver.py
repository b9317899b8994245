#!/usr/bin/env python3
"""A minimal receiver of gavel's webhooks (standard library only).

Verifies the signature, refuses stale timestamps, deduplicates on
`event_id` and applies an item's events in version order: what a platform's
endpoint has to do. Run: python3 deploy/webhook-receiver.py --secret SECRET
"""
import argparse
import hashlib
import hmac
import json
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

MAX_AGE = 300  # seconds, as gavel does for the callbacks it receives

seen_events = set()   # use a table with a unique key in production
last_version = {}     # item_id -> highest item_version applied


def verify(secret: bytes, timestamp: str, signature: str, body: bytes) -> bool:
    if not timestamp or not signature or abs(time.time() - int(timestamp)) > MAX_AGE:
        return False
    expected = "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if not verify(SECRET, self.headers.get("X-Gavel-Timestamp", ""),
                      self.headers.get("X-Gavel-Signature", ""), body):
            self.send_response(401)
            self.end_headers()
            return
        event = json.loads(body)
        if event["event_id"] in seen_events:
            outcome = "duplicate, ignored"
        elif event["item_version"] <= last_version.get(event["item_id"], 0):
            outcome = "older than what we applied, ignored"
        else:
            seen_events.add(event["event_id"])
            last_version[event["item_id"]] = event["item_version"]
            outcome = f"applied: {event['from_status']} -> {event['to_status']} ({event['cause']})"
        print(f"{event['event_id']}: {outcome}", flush=True)
        self.send_response(204)  # any 2xx acknowledges; anything else is retried
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--secret", required=True)
    parser.add_argument("--port", type=int, default=9091)
    args = parser.parse_args()
    SECRET = args.secret.encode()
    print(f"listening on http://127.0.0.1:{args.port}/", flush=True)
    HTTPServer(("127.0.0.1", args.port), Hook).serve_forever()
