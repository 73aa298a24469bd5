"""dfl serve under clients that hold connections, trickle or stop reading (issue 33 item 7), on
loopback with 127.0.0.x source addresses. Every check is a structural outcome (answered, closed,
cancelled), not a time measured; waits are generous bounds for a loaded machine:

- two addresses holding all they may (128 each by default) leave the reserve: /health and a
  generation from another address still answer;
- a client trickling its request one byte every 0.5 s (well inside --timeout 4 of silence) is cut
  at the request deadline (counted in dfl_connections_cut_total);
- a streamed request whose client does not read (a 4 KiB receive buffer) stops generating: the
  request is cancelled, no request completes, and the engine serves the next one."""
import json
import socket
import time

from dfltest import Tally
from test_serve import D3, TINY, Server, metrics

t = Tally("serve_limits")


def connect(port, src, rcvbuf=None):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def closed_by_server(s, wait):
    """True when the server closed s (EOF or reset) within `wait` seconds."""
    s.settimeout(wait)
    try:
        while True:
            b = s.recv(4096)
            if not b:
                return True
    except socket.timeout:
        return False
    except OSError:
        return True


def held_connections():
    srv = Server(TINY, D3, "--timeout", 600)
    held = []
    try:
        head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le"
        for src in ("127.0.0.2", "127.0.0.3"):
            for _ in range(128):
                try:
                    s = connect(srv.port, src)
                    s.sendall(head)
                    held.append(s)
                except OSError:
                    pass
        st, r = srv.json("/health", timeout=60)
        t.check(st == 200, f"/health from a third address with two addresses at their cap: {st} {r}")
        st, r = srv.json("/v1/completions", {"prompt": "The train leaves at", "max_tokens": 4, "temperature": 0},
                         timeout=60)
        t.check(st == 200 and len(r["choices"][0]["token_ids"]) == 4, f"a generation from a third address: {st} {r}")
    finally:
        for s in held:
            s.close()
        t.check(srv.stop() == 0, "server exit status")


def trickle():
    srv = Server(TINY, None, "--timeout", 4)
    try:
        s = connect(srv.port, "127.0.0.2")
        req = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 200 + b"\r\n\r\n"
        closed, t0 = False, time.time()
        for i in range(len(req)):  # one byte every 0.5 s: the inactivity timeout never fires
            if time.time() - t0 > 40:
                break
            try:
                s.sendall(req[i:i + 1])
            except OSError:
                closed = True
                break
            if closed_by_server(s, 0.5):
                closed = True
                break
        s.close()
        t.check(closed, f"a request trickled one byte per 0.5 s is cut (--timeout 4), after {time.time() - t0:.1f} s")
        m = metrics(srv)
        t.check(m.get("dfl_connections_cut_total", 0) >= 1, f"dfl_connections_cut_total {m.get('dfl_connections_cut_total')}")
        t.check(srv.request("/health")[0] == 200, "healthy after")
    finally:
        t.check(srv.stop() == 0, "server exit status")


def unread_stream():
    srv = Server(TINY, D3, "--timeout", 3, "--max-context", 4096)
    try:
        before = metrics(srv)
        body = json.dumps({"prompt": "The train leaves at", "max_tokens": 4000, "temperature": 0, "ignore_eos": True,
                           "stream": True}).encode()
        s = connect(srv.port, "127.0.0.2", rcvbuf=4096)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body)
        key_c, key_ok = "dfl_requests_cancelled_total", 'vllm:request_success_total{model_name="qwen3_tiny"}'
        m, t0 = before, time.time()
        while time.time() - t0 < 90:  # never read from s
            m = metrics(srv)
            if m.get(key_c, 0) > before.get(key_c, 0) or m.get(key_ok, 0) > before.get(key_ok, 0):
                break
            time.sleep(0.25)
        t.check(m.get(key_c, 0) == before.get(key_c, 0) + 1 and m.get(key_ok, 0) == before.get(key_ok, 0),
                f"a stream not read is cancelled, not generated to its end: cancelled {m.get(key_c)}, "
                f"finished {m.get(key_ok)}, stalled {m.get('dfl_streams_stalled_total')}")
        print(f"unread stream: cancelled after {time.time() - t0:.1f} s, dfl_streams_stalled_total "
              f"{m.get('dfl_streams_stalled_total')}", flush=True)
        st, r = srv.json("/v1/completions", {"prompt": "x", "max_tokens": 2, "temperature": 0}, timeout=60)
        t.check(st == 200, f"the engine serves the next request: {st} {r}")
        s.close()
    finally:
        t.check(srv.stop() == 0, "server exit status")


t.run(held_connections)
t.run(trickle)
t.run(unread_stream)
t.done()
