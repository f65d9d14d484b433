"""Which Redis client reaches the primary that holds a key: one server, Sentinel's primary, or a cluster node.

:class:`Routes` hides the topology from :class:`~.redis_store.RedisStore`:

* one server (``redis://``): one client;
* Sentinel (``redis+sentinel://``): the client of ``Sentinel.master_for``,
  whose connections ask the sentinels for the primary each time they
  connect, so a promoted replica is reached without a restart (a demoted
  primary's ``READONLY`` reply drops the connection);
* Cluster (``redis+cluster://``): a ``RedisCluster`` built at first use
  (building it contacts a node), and the client of the node that owns a
  key's slot; :meth:`Routes.refresh` reads the slot map again after a lost
  node or a redirection.

redis-py retries nothing itself here: a redirection or a lost reply is the
store's to retry, with the request's token.
"""

from __future__ import annotations

import time

#: Shortest time between two reads of a cluster's slot map (a failover sends every request to it).
REFRESH_SECONDS = 0.2


class Routes:
    """The clients of one Redis store.

    Parameters
    ----------
    options : dict
        Connection options for redis-py (timeouts, no retries).
    client : redis.Redis, optional
        The one client (one server, or Sentinel's primary).
    cluster : dict, optional
        ``RedisCluster`` arguments (startup nodes, credentials, TLS), for a cluster.
    """

    def __init__(self, options: dict, *, client=None, cluster: dict | None = None):
        import redis

        self.options, self.client, self._cluster_args = options, client, cluster
        self._cluster, self._refreshed = None, 0.0
        self._errors = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)

    @classmethod
    def for_target(cls, target, options: dict) -> "Routes":
        """The routes for a parsed URL (:func:`.redis_urls.parse_redis_url`)."""
        import redis

        if target.topology == "server":  # redis-py's own URL parsing: percent-encoded credentials, TLS, sockets
            return cls(options, client=redis.Redis.from_url(target.server_url, **options))
        if target.topology == "cluster":
            from redis.cluster import ClusterNode

            return cls(options, cluster=dict(startup_nodes=[ClusterNode(h, p) for h, p in target.nodes],
                                             username=target.username, password=target.password, ssl=target.tls))
        from redis.sentinel import Sentinel

        timeouts = {k: options[k] for k in ("socket_connect_timeout", "socket_timeout")}
        auth = ({"password": target.sentinel_password} if target.sentinel_password is not None
                else {"username": target.username, "password": target.password})
        sentinel = Sentinel(list(target.nodes), sentinel_kwargs=dict(ssl=target.tls, **auth, **timeouts), **timeouts)
        return cls(options, client=sentinel.master_for(target.service, db=target.db, username=target.username,
                                                       password=target.password, ssl=target.tls, **options))

    @property
    def is_cluster(self) -> bool:
        """Whether the store is a Redis Cluster."""
        return self._cluster_args is not None

    def _cluster_client(self):
        if self._cluster is None:
            from redis.cluster import RedisCluster

            self._cluster = RedisCluster(**self._cluster_args, **self.options)
            self._refreshed = time.monotonic()
        return self._cluster

    def node(self, key: str):
        """The client of the primary that holds ``key``."""
        if self._cluster_args is None:
            return self.client
        cluster = self._cluster_client()
        return cluster.get_redis_connection(cluster.get_node_from_key(key))

    def primaries(self) -> list:
        """A client per primary: one, or each of the cluster's."""
        if self._cluster_args is None:
            return [self.client]
        cluster = self._cluster_client()
        return [cluster.get_redis_connection(node) for node in cluster.get_primaries()]

    def asked(self, exc):
        """The client of the node an ``ASK`` redirection names (the slot is being moved there)."""
        cluster = self._cluster_client()
        node = cluster.get_node(host=exc.host, port=exc.port)
        if node is None:
            from redis.cluster import ClusterNode

            node = ClusterNode(exc.host, exc.port)
            cluster.nodes_manager.nodes_cache[node.name] = node
        return cluster.get_redis_connection(node)

    def refresh(self, *, now: bool = False) -> None:
        """Read a cluster's slot map again (at most every REFRESH_SECONDS unless ``now``), so the next
        request goes to the slot's new primary."""
        if self._cluster is None or (not now and time.monotonic() - self._refreshed < REFRESH_SECONDS):
            return
        self._refreshed = time.monotonic()
        try:
            self._cluster.nodes_manager.initialize()
        except self._errors:
            pass  # no node answers yet: the next failure tries again

    def close(self) -> None:
        """Release every connection (they are made again at the next use)."""
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None
        elif self.client is not None:
            self.client.close()
