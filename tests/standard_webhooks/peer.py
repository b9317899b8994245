#!/usr/bin/env python3
"""gavel's counterpart in tests/tests/suite/standard_webhooks.rs, built on the
PyPI `standardwebhooks` library (not on gavel's own verifier).

    peer.py receiver   a webhook endpoint: verifies every delivery with the
                       library, answers as told (fail first attempts, a fixed
                       status, Retry-After), logs every request.
    peer.py provider   a classifier: verifies gavel's requests with the
                       library and answers each with a callback the library
                       signed.

Both print their port on the first line of stdout, then serve until killed.
Control (JSON): POST /control sets fields of the state; GET /log returns what
happened; POST /sign {"secret", "id", "timestamp", "body"} returns the
library's signature (the tests send tampered, stale and wrongly signed
callbacks with it).
"""
import json
import sys
import threading
import time
import urllib.request
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

lock = threading.Lock()
state = {
    "secret": None,        # verifies incoming requests
    "sign_secret": None,   # signs callbacks (provider); defaults to `secret`
    "status": 0,           # receiver: answer every request with this (0: 2xx)
    "fail_first": 0,       # receiver: answer the first N attempts of each message with `fail_status`
    "fail_status": 500,
    "retry_after": None,   # sent with `status` / `fail_status` when set
    "verdict": "reject",   # provider: the verdict of every callback
}
log = []
attempts = {}


def sign(secret, msg_id, timestamp, body):
    return Webhook(secret).sign(msg_id, datetime.fromtimestamp(timestamp, tz=timezone.utc), body)


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def reply(self, status, payload=None, headers=()):
        body = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def body(self):
        return self.rfile.read(int(self.headers.get("Content-Length", 0)))

    def do_GET(self):
        if self.path == "/log":
            with lock:
                self.reply(200, list(log))
        else:
            self.reply(404)

    def do_POST(self):
        body = self.body()
        if self.path == "/control":
            with lock:
                state.update(json.loads(body))
            return self.reply(204)
        if self.path == "/sign":
            r = json.loads(body)
            return self.reply(200, {"signature": sign(r["secret"], r["id"], r["timestamp"], r["body"])})
        with lock:
            secret = state["secret"]
        try:
            payload = Webhook(secret).verify(body, dict(self.headers))
        except WebhookVerificationError as e:
            with lock:
                log.append({"webhook_id": self.headers.get("webhook-id"), "verified": False,
                            "error": str(e), "status": 401, "at": time.time()})
            return self.reply(401)
        if MODE == "receiver":
            self.receive(payload)
        else:
            self.classify(payload)

    def receive(self, event):
        msg_id = self.headers["webhook-id"]
        with lock:
            attempts[msg_id] = attempts.get(msg_id, 0) + 1
            if state["status"]:
                status = state["status"]
            elif attempts[msg_id] <= state["fail_first"]:
                status = state["fail_status"]
            else:
                status = 204
            retry_after = state["retry_after"] if status >= 400 else None
            log.append({"webhook_id": msg_id, "event_id": event["event_id"], "verified": True,
                        "signatures": len(self.headers["webhook-signature"].split()),
                        "legacy": "X-Gavel-Signature" in self.headers,
                        "status": status, "at": time.time()})
        self.reply(status, headers=[("Retry-After", str(retry_after))] if retry_after is not None else [])

    def classify(self, request):
        with lock:
            log.append({"request_key": request["request_key"], "webhook_id": self.headers["webhook-id"],
                        "verified": True, "status": 202, "at": time.time()})
        self.reply(202)
        threading.Thread(target=answer, args=(request,), daemon=True).start()


def answer(request):
    """Signs a callback with the library and POSTs it to gavel."""
    with lock:
        secret = state["sign_secret"] or state["secret"]
        verdict = state["verdict"]
    callback = {"event_id": request["request_key"] + "/answer", "request_key": request["request_key"],
                "item_id": request["item_id"], "verdict": verdict, "score": 0.9,
                "label": "stock-library", "reason": "signed by standardwebhooks"}
    body = json.dumps(callback)
    msg_id = "msg_" + request["request_key"].replace(":", "_")
    now = int(time.time())
    headers = {"Content-Type": "application/json", "webhook-id": msg_id, "webhook-timestamp": str(now),
               "webhook-signature": sign(secret, msg_id, now, body)}
    req = urllib.request.Request(request["callback_url"], data=body.encode(), headers=headers, method="POST")
    try:
        status = urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        status = e.code
    with lock:
        log.append({"callback_for": request["request_key"], "status": status, "at": time.time()})


if __name__ == "__main__":
    MODE = sys.argv[1]
    assert MODE in ("receiver", "provider"), "usage: peer.py receiver|provider"
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()
