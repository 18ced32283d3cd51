"""ProxyStore's Python API over the xsilo engine, in one module.

A program written against ProxyStore changes its imports only:

    # from proxystore.store import Store
    # from proxystore.connectors.file import FileConnector
    # from proxystore.proxy import extract
    from xsilo.proxystore import Store, FileConnector, extract

Everything here is also importable from its own module: xsilo.proxy
(Proxy and helpers), xsilo.connectors, xsilo.pstore (Store, registry,
ownership, lifetimes, futures), xsilo.executor, xsilo.stream. See
docs/python.md.
"""

from .connectors import (  # noqa: F401
    Connector,
    EndpointConnector,
    FileConnector,
    LocalConnector,
    MemoryConnector,
    MultiConnector,
    NativeConnector,
    Policy,
    RedisConnector,
    S3Connector,
    UCXConnector,
    ZeroMQConnector,
)
from .proxy import (  # noqa: F401
    Factory,
    Proxy,
    ProxyLockedError,
    ProxyLocker,
    ProxyResolveError,
    SimpleFactory,
    extract,
    is_proxy,
    is_resolved,
    resolve,
    resolve_async,
)
from .pstore import (  # noqa: F401
    ContextLifetime,
    Future,
    LeaseLifetime,
    Lifetime,
    MutableBorrowError,
    OwnedProxy,
    ProxyResolveMissingKeyError,
    ReferenceInvalidError,
    ReferenceNotOwnedError,
    RefMutProxy,
    RefProxy,
    StaticLifetime,
    Store,
    StoreClosedError,
    StoreError,
    StoreExistsError,
    StoreFactory,
    borrow,
    clone,
    get_key,
    get_store,
    into_owned,
    mut_borrow,
    register_store,
    unregister_store,
    update,
)
from .serialize import SerializationError, deserialize, serialize  # noqa: F401
from .serialize import dumps as serialize_parts  # noqa: F401
from .executor import ProxyAlways, ProxyNever, ProxySize, ProxyType, StoreExecutor  # noqa: F401
from .stream import (  # noqa: F401
    QueuePublisher,
    QueueSubscriber,
    RedisPublisher,
    RedisQueuePublisher,
    RedisQueueSubscriber,
    RedisSubscriber,
    StreamConsumer,
    StreamError,
    StreamProducer,
    ZMQPublisher,
    ZMQSubscriber,
)
