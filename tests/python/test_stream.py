"""Streams over each broker: a producer process, two consumer processes.
Keys travel in the events, the arrays in a file store; consumers iterate
proxies. Readiness is signalled (events, XPUB subscriptions, Redis's
subscription confirmations), never waited for with sleeps."""

import multiprocessing
import os
import queue
import threading

import numpy
import pytest

import xsilo.proxystore as ps
from ps_util import RedisServer, consume, free_port, produce

TOPICS = ["alpha", "beta"]
N = 10  # objects per topic
TIMEOUT = 300


@pytest.fixture(scope="module")
def redis_port():
    server = RedisServer()
    yield server.port
    server.stop()


@pytest.fixture
def store(tmp_path):
    s = ps.Store(f"stream-{tmp_path.name}", ps.FileConnector(str(tmp_path / "objects")),
                 register=True)
    yield s
    s.close()


def objects(store):
    return os.listdir(store.connector.config()["dir"])


def expected():
    return {t: [(t, float(1000 * i), {"i": i}) for i in range(N)] for t in TOPICS}


def run(store, pub, pub_args, sub, sub_args, evict):
    """Starts two consumers, then (once both are ready) the producer; returns
    what each consumer received."""
    ctx = multiprocessing.get_context("forkserver")
    out = ctx.Queue()
    consumers = []
    for args in sub_args:
        ready = ctx.Event()
        c = ctx.Process(target=consume, args=(sub, args, out, ready))
        c.start()
        consumers.append((c, ready))
    for c, ready in consumers:
        assert ready.wait(TIMEOUT), "consumer not ready"
    p = ctx.Process(target=produce,
                    args=(pub, pub_args, store.config(), TOPICS, N, 3, evict))
    p.start()
    got = [out.get(timeout=TIMEOUT) for _ in consumers]
    p.join(TIMEOUT)
    for c, _ in consumers:
        c.join(TIMEOUT)
    assert p.exitcode == 0
    for status, value in got:
        assert status == "ok", value
    return [value for _, value in got]


def by_topic(items):
    out = {t: [] for t in TOPICS}
    for item in items:
        out[item[0]].append(item)
    return out


def test_queue_broker_across_processes(store):
    ctx = multiprocessing.get_context("forkserver")
    q1, q2 = ctx.Queue(), ctx.Queue()
    got = run(store, "QueuePublisher", (q1, q2), "QueueSubscriber",
              [(q1, TOPICS, TIMEOUT), (q2, TOPICS, TIMEOUT)], evict=False)
    for items in got:
        assert by_topic(items) == expected()
    assert len(objects(store)) == 2 * N  # broadcast: nothing evicted by the consumers


def test_redis_pubsub_broker(store, redis_port):
    args = ("127.0.0.1", redis_port, TOPICS, "xsilo-stream:", TIMEOUT)
    got = run(store, "RedisPublisher", ("127.0.0.1", redis_port), "RedisSubscriber",
              [args, args], evict=False)
    for items in got:
        assert by_topic(items) == expected()


def test_redis_list_broker_shares_the_work_and_evicts(store, redis_port):
    prefix = f"xsilo-test-{free_port()}:"
    args = ("127.0.0.1", redis_port, TOPICS, prefix, TIMEOUT)
    got = run(store, "RedisQueuePublisher", ("127.0.0.1", redis_port, prefix),
              "RedisQueueSubscriber", [args, args], evict=True)
    merged = by_topic(got[0] + got[1])
    for t in TOPICS:  # each object reached exactly one consumer
        assert sorted(merged[t], key=lambda x: x[2]["i"]) == expected()[t]
    assert objects(store) == []  # each consumed object was evicted on resolve


def test_zmq_broker(store):
    address = f"tcp://127.0.0.1:{free_port()}"
    args = (address, TOPICS, TIMEOUT)
    got = run(store, "ZMQPublisher", (address,), "ZMQSubscriber", [args, args], evict=False)
    for items in got:
        assert by_topic(items) == expected()


def test_in_process_filters_batching_and_consumer_eviction(store):
    q = queue.Queue()
    producer = ps.StreamProducer(ps.QueuePublisher(q), {None: store}, batch_size=4,
                                 filters={"beta": lambda m: m["i"] % 2 == 1})
    for i in range(6):
        for t in TOPICS:
            producer.send(t, {"i": i, "t": t}, evict=False, metadata={"i": i})
    assert q.qsize() == 1  # alpha: one batch of 4 sent, 2 kept; beta: 3 kept (odd i dropped)
    producer.close(topics=TOPICS)
    consumer = ps.StreamConsumer(ps.QueueSubscriber(q, timeout=TIMEOUT), topics=TOPICS,
                                 filter_=lambda m: m["i"] == 4, evict=True)
    got = [(ps.extract(p)["t"], ps.extract(p)["i"]) for p in consumer]
    assert got == [("alpha", 0), ("alpha", 1), ("alpha", 2), ("alpha", 3), ("alpha", 5),
                   ("beta", 0), ("beta", 2)]
    # the consumer evicted what it resolved; the two it filtered out (i == 4) remain
    assert len(objects(store)) == 2


def test_consumer_in_a_thread_sees_end_of_stream(store):
    q = queue.Queue()
    results = []
    consumer = ps.StreamConsumer(ps.QueueSubscriber(q, timeout=TIMEOUT), topics=["x"])
    t = threading.Thread(target=lambda: results.extend(float(numpy.sum(p)) for p in consumer))
    t.start()
    with ps.StreamProducer(ps.QueuePublisher(q), {"x": store}) as producer:
        for i in range(5):
            producer.send("x", numpy.full(10, i))
        producer.close_topics("x")
    t.join(TIMEOUT)
    assert results == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert objects(store) == []  # evict=True is the producer's default


def test_stream_errors(store):
    with pytest.raises(ps.StreamError, match="no store"):
        ps.StreamProducer(ps.QueuePublisher(queue.Queue()), {"a": store}).send("b", 1)
    with pytest.raises(ValueError):
        ps.StreamProducer(ps.QueuePublisher(queue.Queue()), {None: store}, batch_size=0)
    with pytest.raises(ps.StreamError, match="no event"):
        next(ps.StreamConsumer(ps.QueueSubscriber(queue.Queue(), timeout=0.01), topics=["a"]))
