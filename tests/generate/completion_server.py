"""A real OpenAI-compatible completions server on 127.0.0.1 serving a small HF model, with fault injection.

Used by the ``openai`` backend test: ``/v1/models`` and ``/v1/completions`` (token-id prompts, greedy,
``stop_token_ids``, ``return_token_ids``). ``fault(prompt_ids, attempt)`` may return ``"503"`` or
``"timeout"`` (the handler sleeps ``hang_s`` before answering) to exercise the client's retries.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch


class CompletionServer:
    def __init__(self, model_dir, fault=None, hang_s: float = 2.0, name: str = "tiny"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.fault, self.hang_s, self.name = fault, hang_s, name
        self.attempts: Counter = Counter()
        self.served = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    @torch.no_grad()
    def complete(self, body: dict) -> dict:
        ids = body["prompt"]
        stops = set(body.get("stop_token_ids") or [])
        with self.lock:
            out = self.model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                      max_new_tokens=body["max_tokens"], do_sample=False,
                                      eos_token_id=sorted(stops) or None, pad_token_id=0)[0, len(ids):].tolist()
            self.served += 1
        cut = next((i + 1 for i, t in enumerate(out) if t in stops), None)
        toks = out[:cut] if cut else out
        return {"id": "cmpl", "object": "text_completion", "model": self.name, "choices": [{
            "index": 0, "text": self.tok.decode(toks), "finish_reason": "stop" if cut else "length", "token_ids": toks}]}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self):
                if self.path.rstrip("/").endswith("/models"):
                    return self._send(200, {"object": "list", "data": [{"id": server.name, "object": "model"}]})
                self._send(404, {"error": "not found"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = tuple(body["prompt"])
                with server.lock:
                    server.attempts[key] += 1
                    attempt = server.attempts[key]
                what = server.fault(body["prompt"], attempt) if server.fault else None
                if what == "503":
                    return self._send(503, {"error": "injected: overloaded"})
                if what == "timeout":
                    threading.Event().wait(server.hang_s)
                self._send(200, server.complete(body))

        return Handler
