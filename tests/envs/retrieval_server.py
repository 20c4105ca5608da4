"""A real retrieval server for the search tool's tests: BM25 (the bm25s library) over a small corpus written
here, on 127.0.0.1, speaking GEM's msgpack retrieval contract. ``delay_s`` makes it slow on purpose."""

from __future__ import annotations

import http.server
import threading
import time

import bm25s
import msgspec

CORPUS = [
    "Lake Vostok\nLake Vostok lies under about four kilometres of Antarctic ice and is the largest known subglacial lake.",
    "Mount Kosciuszko\nMount Kosciuszko is the highest mountain on the Australian mainland, at 2,228 metres.",
    "Danube\nThe Danube flows through ten countries, more than any other river, and ends in the Black Sea.",
    "Okapi\nThe okapi is a hoofed mammal of the Congo rainforest whose closest living relative is the giraffe.",
    "Bismuth\nBismuth is a brittle metal whose oxide layer shows rainbow colours; its symbol is Bi.",
    "Tristan da Cunha\nTristan da Cunha is a remote inhabited island group in the South Atlantic Ocean.",
]


class RetrievalServer:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.retriever = bm25s.BM25()
        self.retriever.index(bm25s.tokenize(CORPUS, show_progress=False), show_progress=False)
        self.delay_s = delay_s
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                request = msgspec.msgpack.decode(body)
                time.sleep(server.delay_s)
                payload = msgspec.msgpack.encode({"result": server.search(request["query"], int(request.get("topk", 3)))})
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/msgpack")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the slow-server test)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/retrieve"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def search(self, query: str, topk: int) -> list[dict]:
        docs, scores = self.retriever.retrieve(bm25s.tokenize([query], show_progress=False), k=min(topk, len(CORPUS)),
                                               show_progress=False)
        return [{"document": {"contents": CORPUS[int(i)]}, "score": float(s)} for i, s in zip(docs[0], scores[0])]

    def __enter__(self) -> RetrievalServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
