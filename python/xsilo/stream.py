"""Streams of objects: keys travel in events through a broker, bytes in a Store.

    producer = StreamProducer(RedisPublisher("127.0.0.1", 6379), {"t": store},
                              batch_size=8)
    for x in data:
        producer.send("t", x)             # put in the store, key batched
    producer.close_topics("t")            # flush, then end-of-stream
    ...
    consumer = StreamConsumer(RedisSubscriber("127.0.0.1", 6379, ["t"]))
    for obj in consumer:                  # proxies, resolved on first use
        use(obj)                          # evicted on resolve if the event says so

An event is a small pickle: ("objects", topic, [(key, store config, evict,
metadata), ...]) or ("end", topic). Brokers carry events only; each needs a
publisher (send(topic, message), close()) and a subscriber (an iterator of
(topic, message), close()):

- QueuePublisher / QueueSubscriber: in-process queue.Queue, or
  multiprocessing queues across processes; the publisher copies each event
  to every queue it was given (one per consumer).
- RedisPublisher / RedisSubscriber: Redis pub/sub (every subscriber gets
  every event; subscribe before the producer publishes, see ready()).
- RedisQueuePublisher / RedisQueueSubscriber: Redis lists (RPUSH / BLPOP):
  each event goes to one consumer (work sharing); end-of-stream is seen by
  all of them.
- ZMQPublisher / ZMQSubscriber: ZeroMQ PUB/SUB (the publisher is an XPUB
  socket, so wait_for_subscribers(n) waits until n subscriptions arrived).

Events are pickles: connect only brokers you trust.
"""

import pickle
import queue as _queue
import threading
import time

from .proxy import Proxy
from .pstore import StoreFactory

_OBJECTS, _END = "objects", "end"


class StreamError(RuntimeError):
    pass


class _EndOfStream(Exception):
    pass


# -- producer / consumer ------------------------------------------------------

class StreamProducer:
    """Puts objects in stores and publishes their keys.

    stores: {topic: Store}, the None entry for other topics.
    batch_size: keys per event (flush() / close_topics() send the rest).
    filters: {topic: callable(metadata) -> bool}; True drops the object
    before it is stored.
    """

    def __init__(self, publisher, stores, batch_size=1, filters=None):
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.publisher = publisher
        self.stores = dict(stores)
        self.batch_size = int(batch_size)
        self.filters = dict(filters or {})
        self._buffers = {}
        self._lock = threading.Lock()

    def _store(self, topic):
        s = self.stores.get(topic, self.stores.get(None))
        if s is None:
            raise StreamError(f"no store for topic {topic!r}")
        return s

    def send(self, topic, obj, evict=True, metadata=None):
        """Stores obj and queues its key for topic. Returns the key, or None
        when the topic's filter dropped the object."""
        f = self.filters.get(topic)
        if f is not None and f(metadata or {}):
            return None
        store = self._store(topic)
        key = store.put(obj)
        item = (key, store.config(), bool(evict), metadata or {})
        with self._lock:
            buf = self._buffers.setdefault(topic, [])
            buf.append(item)
            batch = None
            if len(buf) >= self.batch_size:
                batch, self._buffers[topic] = buf, []
        if batch:
            self.publisher.send(topic, pickle.dumps((_OBJECTS, topic, batch)))
        return key

    def flush_topic(self, topic):
        with self._lock:
            batch = self._buffers.pop(topic, [])
        if batch:
            self.publisher.send(topic, pickle.dumps((_OBJECTS, topic, batch)))

    def flush(self):
        for topic in list(self._buffers):
            self.flush_topic(topic)

    def close_topics(self, *topics):
        """Flushes each topic, then sends its end-of-stream."""
        for t in topics:
            self.flush_topic(t)
            self.publisher.send(t, pickle.dumps((_END, t)))

    def close(self, topics=(), close_publisher=True):
        self.close_topics(*topics)
        self.flush()
        if close_publisher:
            self.publisher.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class StreamConsumer:
    """Iterates the objects of a stream as proxies.

    topics: the topics whose end-of-stream ends the iteration (default: the
    subscriber's topics; with none known, the first end-of-stream ends it).
    filter_: callable(metadata) -> bool; True skips the object.
    evict: None follows each event (the producer's evict flag); True or
    False overrides it: the consumer evicts each object when it resolves it.
    """

    def __init__(self, subscriber, topics=None, filter_=None, evict=None):
        self.subscriber = subscriber
        self.topics = set(topics if topics is not None else getattr(subscriber, "topics", ()))
        self.filter_ = filter_
        self.evict = evict
        self._pending = []
        self._ended = set()

    def _next_item(self):
        while not self._pending:
            if self.topics and self._ended >= self.topics:
                raise _EndOfStream
            try:
                topic, message = next(self.subscriber)
            except StopIteration:
                raise _EndOfStream from None
            event = pickle.loads(message)
            if event[0] == _END:
                self._ended.add(event[1])
                if not self.topics:
                    raise _EndOfStream
                continue
            _, topic, items = event
            for key, config, evict, metadata in items:
                if self.filter_ is not None and self.filter_(metadata):
                    continue
                self._pending.append((topic, key, config, evict, metadata))
        return self._pending.pop(0)

    def next_with_metadata(self):
        """(topic, proxy, metadata); StopIteration at end of stream."""
        try:
            topic, key, config, evict, metadata = self._next_item()
        except _EndOfStream:
            raise StopIteration from None
        ev = evict if self.evict is None else self.evict
        return topic, Proxy(StoreFactory(key, config, ev)), metadata

    def next_proxy(self):
        return self.next_with_metadata()[1]

    def next_object(self):
        """The next object itself (resolved, so evicted if it is to be)."""
        return self.next_proxy().__wrapped__

    def __iter__(self):
        return self

    def __next__(self):
        return self.next_proxy()

    def iter_with_metadata(self):
        while True:
            try:
                yield self.next_with_metadata()
            except StopIteration:
                return

    def close(self):
        self.subscriber.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# -- brokers ------------------------------------------------------------------

class QueuePublisher:
    """Events onto queues (queue.Queue in a process, multiprocessing queues
    across processes); every queue gets every event."""

    def __init__(self, *queues):
        if not queues:
            raise ValueError("QueuePublisher needs at least one queue")
        self.queues = queues

    def send(self, topic, message):
        for q in self.queues:
            q.put((topic, message))

    def close(self):
        pass


class QueueSubscriber:
    """Events from one queue; timeout (seconds) bounds each wait (StreamError)."""

    def __init__(self, q, topics=(), timeout=None):
        self.q = q
        self.topics = tuple(topics)
        self.timeout = timeout

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                topic, message = self.q.get(timeout=self.timeout)
            except _queue.Empty:
                raise StreamError(f"no event within {self.timeout}s") from None
            if not self.topics or topic in self.topics:
                return topic, message

    def close(self):
        pass


def _redis(host, port):
    import redis

    return redis.Redis(host=host, port=int(port))


class RedisPublisher:
    """Events as Redis pub/sub messages on channel <prefix><topic>."""

    def __init__(self, hostname="127.0.0.1", port=6379, prefix="xsilo-stream:"):
        self.client = _redis(hostname, port)
        self.prefix = prefix

    def send(self, topic, message):
        self.client.publish(self.prefix + topic, message)

    def subscribers(self, topic):
        """How many clients are subscribed to topic now (PUBSUB NUMSUB)."""
        return dict(self.client.pubsub_numsub(self.prefix + topic)).get(
            (self.prefix + topic).encode(), 0)

    def close(self):
        self.client.close()


class RedisSubscriber:
    """Subscribes to topics at construction (confirmed by the server before
    the constructor returns, so a producer that starts afterwards loses
    nothing). timeout (seconds) bounds each wait (StreamError)."""

    def __init__(self, hostname="127.0.0.1", port=6379, topics=(), prefix="xsilo-stream:",
                 timeout=None):
        if not topics:
            raise ValueError("RedisSubscriber needs topics")
        self.client = _redis(hostname, port)
        self.prefix = prefix
        self.topics = tuple(topics)
        self.timeout = timeout
        self.pubsub = self.client.pubsub()
        self.pubsub.subscribe(*[prefix + t for t in self.topics])
        confirmed = 0
        while confirmed < len(self.topics):
            m = self.pubsub.get_message(timeout=30)
            if m is None:
                raise StreamError("redis did not confirm the subscription")
            if m["type"] == "subscribe":
                confirmed += 1

    def __iter__(self):
        return self

    def __next__(self):
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while True:
            wait = 1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            m = self.pubsub.get_message(timeout=wait)
            if m is not None and m["type"] == "message":
                return m["channel"].decode()[len(self.prefix):], m["data"]
            if deadline is not None and time.monotonic() >= deadline:
                raise StreamError(f"no event within {self.timeout}s")

    def close(self):
        self.pubsub.close()
        self.client.close()


class RedisQueuePublisher:
    """Events pushed onto Redis lists <prefix><topic> (RPUSH)."""

    def __init__(self, hostname="127.0.0.1", port=6379, prefix="xsilo-queue:"):
        self.client = _redis(hostname, port)
        self.prefix = prefix

    def send(self, topic, message):
        self.client.rpush(self.prefix + topic, message)

    def close(self):
        self.client.close()


class RedisQueueSubscriber:
    """Pops events from the topics' lists (BLPOP): each event reaches one
    consumer. An end-of-stream is pushed back, so every consumer sees it."""

    def __init__(self, hostname="127.0.0.1", port=6379, topics=(), prefix="xsilo-queue:",
                 timeout=None):
        if not topics:
            raise ValueError("RedisQueueSubscriber needs topics")
        self.client = _redis(hostname, port)
        self.prefix = prefix
        self.topics = tuple(topics)
        self.timeout = timeout
        self._ended = set()

    def __iter__(self):
        return self

    def __next__(self):
        lists = [self.prefix + t for t in self.topics if t not in self._ended]
        if not lists:
            raise StopIteration
        got = self.client.blpop(lists, timeout=0 if self.timeout is None else self.timeout)
        if got is None:
            raise StreamError(f"no event within {self.timeout}s")
        name, message = got
        topic = name.decode()[len(self.prefix):]
        if pickle.loads(message)[0] == _END:
            self.client.lpush(name, message)  # for the other consumers
            self._ended.add(topic)
        return topic, message

    def close(self):
        self.client.close()


class ZMQPublisher:
    """Events on a ZeroMQ XPUB socket bound at address ("tcp://127.0.0.1:5555")."""

    def __init__(self, address):
        import zmq

        self._zmq = zmq
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.XPUB)
        self.socket.setsockopt(zmq.LINGER, 10000)
        self.socket.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscriber's subscription
        self.socket.bind(address)
        self._subscriptions = 0

    def wait_for_subscribers(self, n, timeout=60.0):
        """Returns once n subscriptions (one per subscriber and topic) reached
        this socket: PUB/SUB drops events sent before a subscription
        arrives. TimeoutError after timeout seconds."""
        deadline = time.monotonic() + timeout
        while self._subscriptions < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self._subscriptions} of {n} subscriptions after {timeout}s")
            if self.socket.poll(int(left * 1000) + 1):
                if self.socket.recv()[:1] == b"\x01":
                    self._subscriptions += 1

    def send(self, topic, message):
        self.socket.send_multipart([topic.encode(), message])

    def close(self):
        self.socket.close()
        self.context.term()


class ZMQSubscriber:
    """A ZeroMQ SUB socket connected to address, subscribed to topics."""

    def __init__(self, address, topics=(), timeout=None):
        import zmq

        if not topics:
            raise ValueError("ZMQSubscriber needs topics")
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.topics = tuple(topics)
        self.timeout = timeout
        for t in self.topics:
            self.socket.setsockopt(zmq.SUBSCRIBE, t.encode())
        self.socket.connect(address)

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            if self.timeout is not None and not self.socket.poll(int(self.timeout * 1000)):
                raise StreamError(f"no event within {self.timeout}s")
            topic, message = self.socket.recv_multipart()
            topic = topic.decode()
            if topic in self.topics:  # SUB matches prefixes
                return topic, message

    def close(self):
        self.socket.close(linger=0)
        self.context.term()
