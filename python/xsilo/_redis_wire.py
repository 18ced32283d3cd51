"""The engine's Redis object layout, spoken from Python (the Store's Redis path).

Layout (src/store/redis/redis_connector.cpp): an object of N bytes is
stored as parts "<prefix>:<id>:<i>" of at most part_bytes each, then a
commit record "<prefix>:<id>" = "<N> <parts>" is written last; the key is
the engine's JSON {"c":"redis","id":...,"size":N}. Objects written here are
read by the engine's redis connector and the other way round.

Why not through the engine: its hiredis path makes two round trips per put
and per get, formats each command with its payload into one buffer (a
copy) and copies each reply into a new Buffer, which made it slower than
redis-py (docs/python.md). Here a put is one pipelined round trip whose
payload goes from the object's own memory to the socket, and a get is one
round trip (commit record and first part together) whose reply is read
straight into the destination buffer.
"""

import json
import os
import socket
import threading
import time
import uuid


class RedisWireError(RuntimeError):
    pass


_CRLF = b"\r\n"
_INLINE = 1 << 16  # arguments up to this size are copied into the command buffer
_SIGNAL_TTL = 24 * 3600  # seconds a future's signal list lives (the engine's kSignalTtlSeconds)


class _Conn:
    def __init__(self, host, port, password, timeout):
        self.sock = socket.create_connection((host, port), timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.pos = 0
        if password:
            self.send([[b"AUTH", password.encode()]])
            self.reply()

    def close(self):
        self.sock.close()

    def send(self, commands):
        """Sends commands; an argument is a buffer, or a list of buffers sent
        as one bulk string (their concatenation, never built here)."""
        small = bytearray()
        for args in commands:
            small += b"*%d\r\n" % len(args)
            for a in args:
                pieces = a if isinstance(a, list) else [a]
                pieces = [p if isinstance(p, bytes) else memoryview(p).cast("B") for p in pieces]
                small += b"$%d\r\n" % sum(len(p) for p in pieces)
                for mv in pieces:
                    if len(mv) > _INLINE:
                        self.sock.sendall(small)
                        self.sock.sendall(mv)
                        small = bytearray()
                    else:
                        small += mv
                small += _CRLF
        if small:
            self.sock.sendall(small)

    def _fill(self):
        if self.pos and self.pos == len(self.buf):
            self.buf.clear()
            self.pos = 0
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self.buf += chunk

    def _line(self):
        while True:
            i = self.buf.find(_CRLF, self.pos)
            if i >= 0:
                line = bytes(self.buf[self.pos:i])
                self.pos = i + 2
                return line
            self._fill()

    def _read_into(self, mv):
        n = min(len(self.buf) - self.pos, len(mv))
        mv[:n] = self.buf[self.pos:self.pos + n]
        self.pos += n
        while n < len(mv):
            r = self.sock.recv_into(mv[n:])
            if r == 0:
                raise ConnectionError("redis closed the connection")
            n += r

    def reply(self, into=None):
        """One reply. A bulk string goes into into(n) (a writable buffer of n
        bytes) when given, else into a new bytes object."""
        line = self._line()
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest
        if t == b"-":
            raise RedisWireError(rest.decode(errors="replace"))
        if t == b":":
            return int(rest)
        if t == b"*":  # an array (BLPOP's key and value); *-1 is nil
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            if into is None:
                while len(self.buf) - self.pos < n + 2:
                    self._fill()
                out = bytes(self.buf[self.pos:self.pos + n])
                self.pos += n + 2
                return out
            dest = into(n)
            self._read_into(memoryview(dest).cast("B")[:n])
            crlf = bytearray(2)
            self._read_into(memoryview(crlf))
            return dest
        raise RedisWireError(f"unexpected redis reply {line[:40]!r}")


def _empty(n):
    import numpy

    return numpy.empty(n, dtype=numpy.uint8)


_known_passwords = {}  # "host:port" -> the password of a connector this process made
_known_lock = threading.Lock()


def password_for(options):
    """The redis password of these options, resolved as the engine does
    (src/store/redis/redis_connector.cpp): `password`, else `password_file`
    (mode 600), else one this process already used for the same host and
    port, else REDISCLI_AUTH; None when there is none. A config carries no
    password, so the receiving side finds its own here."""
    server = f"{options.get('host', '127.0.0.1')}:{int(options.get('port', 6379))}"
    password = options.get("password") or None
    path = options.get("password_file")
    if not password and path:
        st = os.stat(path)
        if st.st_mode & 0o077:
            raise ValueError(f"redis password_file {path} can be read by its group or others "
                             "(chmod 600)")
        with open(path) as f:
            password = f.read().rstrip() or None
        if password is None:
            raise ValueError(f"redis password_file {path} is empty")
    with _known_lock:
        if not password:
            password = _known_passwords.get(server)
        if not password:
            password = os.environ.get("REDISCLI_AUTH") or None
        if password:
            _known_passwords[server] = password
    return password


class RedisWire:
    """Puts, gets, exists and evicts in the engine's Redis layout."""

    def __init__(self, options):
        self.host = options.get("host", "127.0.0.1")
        self.port = int(options.get("port", 6379))
        self.password = password_for(options)
        self.prefix = options.get("prefix", "xsilo")
        self.part_bytes = int(options.get("part_bytes", 256 << 20))
        self.timeout = int(options.get("timeout_ms", 30000)) / 1000
        self._idle = []
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _acquire(self):
        with self._lock:
            if self._pid != os.getpid():  # forked: the parent's sockets are not ours
                self._idle, self._pid = [], os.getpid()
            if self._idle:
                return self._idle.pop()
        return _Conn(self.host, self.port, self.password, self.timeout)

    def _release(self, c):
        with self._lock:
            if self._pid == os.getpid() and len(self._idle) < 8:
                self._idle.append(c)
                return
        c.close()

    def _run(self, fn):
        c = self._acquire()
        try:
            out = fn(c)
        except BaseException:
            c.close()
            raise
        self._release(c)
        return out

    def close(self):
        with self._lock:
            idle, self._idle = self._idle, []
        for c in idle:
            c.close()

    def _meta(self, id_):
        return f"{self.prefix}:{id_}".encode()

    def _signal(self, id_):
        return f"{self.prefix}:{id_}:signal".encode()

    def _wake(self, id_):
        """The commands that wake a deferred key's waiters (and keep the
        signal list a day, as the engine's notifier does)."""
        signal = self._signal(id_)
        return [[b"RPUSH", signal, b"1"], [b"EXPIRE", signal, str(_SIGNAL_TTL).encode()]]

    def _part(self, id_, i):
        return f"{self.prefix}:{id_}:{i}".encode()

    @staticmethod
    def _id(key):
        k = json.loads(key)
        if k.get("c") != "redis" or not isinstance(k.get("id"), str):
            raise ValueError(f"not a redis key: {key!r}")
        return k["id"]

    def put(self, segments):
        """Stores the concatenation of segments (buffers); returns the key."""
        id_ = uuid.uuid4().hex
        size = self._write(id_, segments, [])
        return json.dumps({"c": "redis", "id": id_, "size": size}, separators=(",", ":"))

    def new_key(self):
        """A deferred key (size 0 until set), as the engine's NewKey."""
        return json.dumps({"c": "redis", "id": uuid.uuid4().hex, "size": 0},
                          separators=(",", ":"))

    def set(self, key, segments):
        """Writes the object under a deferred key and wakes its waiters: one
        push onto the signal list "<prefix>:<id>:signal", which is what the
        engine's waiters block on (src/store/future/notifier.cpp)."""
        id_ = self._id(key)
        self._write(id_, segments, self._wake(id_))

    def wait(self, key, timeout):
        """True once the key exists, False when timeout seconds passed first.
        Blocks on the signal list (BLPOP, pushed back for the other waiters)
        and re-checks the key at least every second, so a value written
        without a signal is seen too."""
        id_ = self._id(key)
        deadline = time.monotonic() + max(0.0, timeout)

        def go(c):
            while True:
                c.send([[b"EXISTS", self._meta(id_)]])
                if c.reply() == 1:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                block = min(1.0, max(remaining, 0.001))
                c.sock.settimeout(block + self.timeout)
                c.send([[b"BLPOP", self._signal(id_), b"%.3f" % block]])
                popped = c.reply()
                c.sock.settimeout(self.timeout)
                if popped is not None:  # pushed back: the other waiters wake too
                    c.send(self._wake(id_))
                    c.reply()
                    c.reply()

        return self._run(go)

    def _write(self, id_, segments, after):
        """The parts, then the commit record, then the commands in after, in
        one pipelined round trip; returns the size."""
        segs = [memoryview(s).cast("B") for s in segments]
        size = sum(len(s) for s in segs)
        parts = (size + self.part_bytes - 1) // self.part_bytes
        commands = []
        seg, off = 0, 0
        for i in range(parts):
            # One SET per part, its value sent from the segments' own memory:
            # Redis keeps a large argument as the value without copying it,
            # where an APPEND onto a first piece copied (and grew) it.
            remaining = min(self.part_bytes, size - i * self.part_bytes)
            pieces = []
            while remaining > 0:
                while len(segs[seg]) == off:
                    seg, off = seg + 1, 0
                n = min(remaining, len(segs[seg]) - off)
                pieces.append(segs[seg][off:off + n])
                off += n
                remaining -= n
            commands.append([b"SET", self._part(id_, i), pieces])
        commands.append([b"SET", self._meta(id_), f"{size} {parts}".encode()])
        commands += after

        def go(c):
            c.send(commands)
            for _ in commands:
                c.reply()

        self._run(go)
        return size

    def get(self, key):
        """The object's bytes (a writable numpy uint8 array), or None."""
        k = json.loads(key)
        if k.get("c") != "redis" or not isinstance(k.get("id"), str):
            raise ValueError(f"not a redis key: {key!r}")
        id_, size = k["id"], int(k.get("size", 0))
        if size == 0:  # a deferred key (a future's) names no size: the commit record has it
            def meta(c):
                c.send([[b"GET", self._meta(id_)]])
                return c.reply()

            m = self._run(meta)
            if m is None:
                return None
            size = int(m.split()[0])
        out = _empty(size)  # the whole object, read in place part by part

        def into(pos):
            def f(n):
                if pos + n > size:
                    raise RedisWireError(f"redis object {id_} is malformed")
                got[0] = n
                return memoryview(out)[pos:pos + n]
            return f

        got = [0]

        def go(c):
            c.send([[b"GET", self._meta(id_)], [b"GET", self._part(id_, 0)]])
            meta = c.reply()
            first = c.reply(into=into(0))
            if meta is None:
                return None
            total, parts = (int(x) for x in meta.split())
            if total != size:
                raise RedisWireError(f"redis object {id_}: {total} bytes, its key says {size}")
            if parts == 0:
                return out
            if first is None:
                return None
            pos = got[0]
            if parts > 1:
                c.send([[b"GET", self._part(id_, i)] for i in range(1, parts)])
                missing = False
                for _ in range(1, parts):
                    if c.reply(into=into(pos)) is None:
                        missing = True
                    else:
                        pos += got[0]
                if missing:
                    return None
            if pos != size:
                raise RedisWireError(f"redis object {id_} has {pos} of {size} bytes")
            return out

        return self._run(go)

    def exists(self, key):
        id_ = self._id(key)

        def go(c):
            c.send([[b"EXISTS", self._meta(id_)]])
            return c.reply() == 1

        return self._run(go)

    def evict(self, key):
        id_ = self._id(key)

        def go(c):
            c.send([[b"GET", self._meta(id_)]])
            meta = c.reply()
            parts = int(meta.split()[1]) if meta else 0
            cmds = [[b"DEL", self._meta(id_)]] + [[b"DEL", self._part(id_, i)] for i in
                                                   range(parts)] + [[b"DEL", self._signal(id_)]]
            c.send(cmds)
            for _ in cmds:
                c.reply()

        self._run(go)
