#!/usr/bin/env python3
"""A minimal receiver of gavel's webhooks, on the Standard Webhooks library
(`pip install standardwebhooks==1.1.0`).

The library verifies the signature (any of the space-separated `v1,`
entries, so a secret rotation needs no downtime) and refuses timestamps more
than five minutes old. This receiver then deduplicates on `event_id` and
applies an item's events in version order: what a platform's endpoint has to
do. Run: python3 deploy/webhook-receiver.py --secret whsec_...
"""
import argparse
import json
from http.server import BaseHTTPRequestHandler, HTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

seen_events = set()   # use a table with a unique key in production
last_version = {}     # item_id -> highest item_version applied


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            event = WEBHOOK.verify(body, dict(self.headers))
        except WebhookVerificationError:
            self.send_response(401)
            self.end_headers()
            return
        if event["event_id"] in seen_events:
            outcome = "duplicate, ignored"
        elif event["item_version"] <= last_version.get(event["item_id"], 0):
            outcome = "older than what we applied, ignored"
        else:
            seen_events.add(event["event_id"])
            last_version[event["item_id"]] = event["item_version"]
            outcome = f"applied: {event['from_status']} -> {event['to_status']} ({event['cause']})"
        print(f"{event['event_id']}: {outcome}", flush=True)
        # Any 2xx acknowledges; 410 disables the endpoint; 429/503 with
        # Retry-After are retried no earlier than asked; anything else is retried.
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--secret", required=True, help="whsec_... (a legacy raw secret: prefix it with raw:)")
    parser.add_argument("--port", type=int, default=9091)
    args = parser.parse_args()
    # A legacy raw secret is its bytes, not base64.
    secret = args.secret[4:].encode() if args.secret.startswith("raw:") else args.secret
    WEBHOOK = Webhook(secret)
    print(f"listening on http://127.0.0.1:{args.port}/", flush=True)
    HTTPServer(("127.0.0.1", args.port), Hook).serve_forever()
