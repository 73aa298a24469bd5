"""dfl serve under clients that hold connections, trickle or stop reading (issue 33 item 7), on
loopback with 127.0.0.x source addresses. Every check is a structural outcome (answered, closed,
cancelled), not a time measured; waits are generous bounds for a loaded machine (the latency under
a flood is measured by bench/serve-flood, not here):

- 1,000 connections from 250 addresses, half-sent and held (--timeout 600), and then half idle,
  half trickling a byte a second and reconnecting when cut (--timeout 2): /health and a
  generation from another address answer 20 times out of 20;
- two addresses holding all they may (--max-connections 256, 128 per client) leave the
  reserve: /health and a generation from another address still answer;
- a client trickling its request one byte every 0.5 s (well inside --timeout 4 of silence) is cut
  at the request deadline (counted in dfl_connections_cut_total);
- a streamed request whose client does not read (a 4 KiB receive buffer) stops generating: the
  request is cancelled (dfl_streams_stalled_total), no request completes, and the engine serves
  the next one;
- clients that go away while their requests wait for the engine (one running, one queued, not
  streamed: their connections are suspended) cancel both."""
import json
import resource
import selectors
import socket
import threading
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


class Flood:
    """n_addr x per_addr connections from 127.0.0.2.. that send the start of a request; every
    `trickle`-th one then sends one more header byte per second. A connection the server closes is
    opened again (at most once per 0.2 s). Runs on its own thread until stop()."""

    HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "

    def __init__(self, port, n_addr=250, per_addr=4, trickle=0):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        need = n_addr * per_addr + 256
        if soft < need:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))
        self.port, self.trickle = port, trickle
        self.slots = [f"127.0.0.{2 + i}" for i in range(n_addr) for _ in range(per_addr)]
        self.socks = [None] * len(self.slots)
        self.retry = [0.0] * len(self.slots)
        self.opened = self.closed = 0
        self.sel = selectors.DefaultSelector()
        self.quit = threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def open(self, i):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((self.slots[i], 0))
            s.settimeout(2)
            s.connect(("127.0.0.1", self.port))
            s.sendall(self.HEAD)
            s.setblocking(False)
        except OSError:
            s.close()
            return
        self.socks[i] = s
        self.sel.register(s, selectors.EVENT_READ, i)
        self.opened += 1

    def drop(self, i):
        self.sel.unregister(self.socks[i])
        self.socks[i].close()
        self.socks[i] = None
        self.retry[i] = time.time() + 0.2
        self.closed += 1

    def run(self):
        next_trickle = time.time() + 1
        while not self.quit.is_set():
            now = time.time()
            for i, s in enumerate(self.socks):
                if s is None and now >= self.retry[i]:
                    self.open(i)
            for key, _ in self.sel.select(timeout=0.1):
                try:
                    if key.fileobj.recv(4096):
                        continue
                except BlockingIOError:
                    continue
                except OSError:
                    pass
                self.drop(key.data)
            if self.trickle and time.time() >= next_trickle:
                next_trickle += 1
                for i in range(0, len(self.socks), self.trickle):
                    if self.socks[i] is not None:
                        try:
                            self.socks[i].send(b"a")
                        except OSError:
                            self.drop(i)

    def open_now(self):
        return sum(s is not None for s in self.socks)

    def stop(self):
        self.quit.set()
        self.th.join()
        for s in self.socks:
            if s is not None:
                s.close()


def flood(timeout, trickle):
    """20 rounds of /health and a generation from 127.0.0.1 while 250 other addresses hold 1,000
    connections."""
    srv = Server(TINY, D3, "--timeout", timeout)
    fl = None
    try:
        fl = Flood(srv.port, trickle=trickle)
        deadline = time.time() + 120
        while fl.opened < len(fl.slots) and time.time() < deadline:
            time.sleep(0.2)
        t.check(fl.opened >= len(fl.slots), f"the flood opened its {len(fl.slots)} connections: {fl.opened}")
        if trickle:  # probe while the server cuts and the flood reopens: after as many cuts as slots
            while fl.closed < len(fl.slots) and time.time() < deadline:
                time.sleep(0.2)
            t.check(fl.closed >= len(fl.slots), f"the server closed idle and trickling connections: {fl.closed}")
        ok = 0
        for i in range(20):
            st, r = srv.json("/health", timeout=30)
            st2, r2 = srv.json("/v1/completions", {"prompt": "The train leaves at", "max_tokens": 4, "temperature": 0},
                               timeout=30)
            good = st == 200 and st2 == 200 and len(r2["choices"][0]["token_ids"]) == 4
            ok += good
            if not good:
                print(f"round {i}: /health {st} {r}, generation {st2} {r2}", flush=True)
        m = metrics(srv)
        print(f"--timeout {timeout}, trickle {trickle}: {fl.open_now()} flood connections open, {fl.opened} opened, "
              f"{fl.closed} closed by the server; cut {m.get('dfl_connections_cut_total')}", flush=True)
        t.check(ok == 20, f"/health and a generation from another address under the flood: {ok} of 20 rounds")
        if trickle:
            t.check(m.get("dfl_connections_cut_total", 0) >= 1, "trickling connections cut at the request deadline")
    finally:
        if fl:
            fl.stop()
        t.check(srv.stop() == 0, "server exit status")


def flood_held():
    flood(600, 0)


def flood_cycling():
    flood(2, 2)


def held_connections():
    srv = Server(TINY, D3, "--timeout", 600, "--max-connections", 256, "--max-connections-per-client", 128)
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
        key_s = "dfl_streams_stalled_total"
        t.check(m.get(key_c, 0) == before.get(key_c, 0) + 1 and m.get(key_ok, 0) == before.get(key_ok, 0) and
                m.get(key_s, 0) == before.get(key_s, 0) + 1,
                f"a stream not read is cancelled, not generated to its end: cancelled {m.get(key_c)}, "
                f"finished {m.get(key_ok)}, stalled {m.get('dfl_streams_stalled_total')}")
        print(f"unread stream: cancelled after {time.time() - t0:.1f} s, dfl_streams_stalled_total "
              f"{m.get('dfl_streams_stalled_total')}", flush=True)
        st, r = srv.json("/v1/completions", {"prompt": "x", "max_tokens": 2, "temperature": 0}, timeout=60)
        t.check(st == 200, f"the engine serves the next request: {st} {r}")
        s.close()
    finally:
        t.check(srv.stop() == 0, "server exit status")


def gone_while_waiting():
    srv = Server(TINY, D3, "--timeout", 600, "--max-context", 4096)
    try:
        before = metrics(srv)
        key_c, key_w = "dfl_requests_cancelled_total", 'vllm:num_requests_waiting{model_name="qwen3_tiny"}'
        body = json.dumps({"prompt": "The train leaves at", "max_tokens": 4000, "temperature": 0,
                           "ignore_eos": True}).encode()
        socks = []
        for _ in range(2):  # one runs, one waits behind it
            s = connect(srv.port, "127.0.0.2")
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n" % len(body)
                      + body)
            socks.append(s)
        m, t0 = before, time.time()
        while m.get(key_w, 0) < 1 and time.time() - t0 < 60:
            m = metrics(srv)
            time.sleep(0.1)
        t.check(m.get(key_w, 0) == 1, f"one request waiting behind the running one: {m.get(key_w)}")
        for s in socks:
            s.close()
        while m.get(key_c, 0) < before.get(key_c, 0) + 2 and time.time() - t0 < 90:
            m = metrics(srv)
            time.sleep(0.1)
        t.check(m.get(key_c, 0) == before.get(key_c, 0) + 2, f"both requests cancelled: {m.get(key_c)}")
        st, r = srv.json("/v1/completions", {"prompt": "x", "max_tokens": 2, "temperature": 0}, timeout=60)
        t.check(st == 200, f"the engine serves the next request: {st} {r}")
    finally:
        t.check(srv.stop() == 0, "server exit status")


t.run(flood_held)
t.run(flood_cycling)
t.run(held_connections)
t.run(trickle)
t.run(unread_stream)
t.run(gone_while_waiting)
t.done()
