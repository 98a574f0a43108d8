"""The series index on Cassandra: series metadata, the tag and Graphite path indexes."""

from collections.abc import Iterable, Sequence

from twisted.internet import defer

from gateway.core.layout import INDEX_BUCKET_MS
from gateway.core.model import SeriesKey, now_ms
from gateway.store.cassandra_base import PLAIN_ROWS, READ_SERIES_PER_REQUEST, CassandraBase
from gateway.store.contract import Buckets, PathNode
from gateway.store.deletion import INDEX_KEYS
from gateway.store.index import BUCKET_TABLES, LISTINGS, bucket_index_rows, bucket_table, index_rows

# The statements of a listing: as it is, and with a LIMIT (``most_rows``, contract.py ``_listing``).
LISTING_LIMITS = (("", ""), ("_limited", " LIMIT ?"))
# A bounded listing reads at most this many buckets, a request each: a day of the time index.
BOUNDED_LISTING_REQUESTS = 24


class CassandraIndex(CassandraBase):
    """The IndexStore role (contract.py)."""

    def _statement_texts(self) -> dict[str, str]:
        ks = self.keyspace
        return {
            **super()._statement_texts(),
            "tenant": f"INSERT INTO {ks}.tenants (tenant) VALUES (?) USING TTL ?",
            "metric_name": f"INSERT INTO {ks}.metric_names (tenant, metric_name) VALUES (?, ?) USING TTL ?",
            "series_set_hash": f"INSERT INTO {ks}.series_set_hashes (tenant, series_set_hash, metric_name, tags) VALUES (?, ?, ?, ?) USING TTL ?",
            "series_set": f"INSERT INTO {ks}.series_sets (tenant, metric_name, tag_key, tag_value, series_set_hash) VALUES (?, ?, ?, ?, ?) USING TTL ?",
            "tag_key": f"INSERT INTO {ks}.tag_keys (tenant, metric_name, tag_key) VALUES (?, ?, ?) USING TTL ?",
            "tag_value": f"INSERT INTO {ks}.tag_values (tenant, metric_name, tag_key, tag_value) VALUES (?, ?, ?, ?) USING TTL ?",
            "path_leaf": f"UPDATE {ks}.graphite_paths USING TTL ? SET is_leaf = true WHERE tenant = ? AND parent = ? AND name = ?",
            "path_branch": f"UPDATE {ks}.graphite_paths USING TTL ? SET is_branch = true WHERE tenant = ? AND parent = ? AND name = ?",
            "tenant_tag_key": f"INSERT INTO {ks}.tenant_tag_keys (tenant, tag_key) VALUES (?, ?) USING TTL ?",
            "tenant_tag_value": f"INSERT INTO {ks}.tenant_tag_values (tenant, tag_key, tag_value) VALUES (?, ?, ?) USING TTL ?",
            "tag_metric": f"INSERT INTO {ks}.tag_metrics (tenant, tag_key, tag_value, metric_name) VALUES (?, ?, ?, ?) USING TTL ?",
            "list_path_children": f"SELECT name, is_leaf, is_branch FROM {ks}.graphite_paths WHERE tenant = ? AND parent = ?",
            "list_tenants": f"SELECT tenant FROM {ks}.tenants",
            "last_buckets": f"SELECT series_set_hash, metric_name, last_bucket FROM {ks}.series_set_hashes WHERE tenant = ? AND series_set_hash IN ?",
            "last_bucket": f"UPDATE {ks}.series_set_hashes USING TTL ? AND TIMESTAMP ? SET last_bucket = ? WHERE tenant = ? AND series_set_hash = ?",
            "get_series": f"SELECT series_set_hash, metric_name, tags FROM {ks}.series_set_hashes WHERE tenant = ? AND series_set_hash IN ?",
            "path_flags": f"UPDATE {ks}.graphite_paths USING TTL ? SET is_leaf = ?, is_branch = ? WHERE tenant = ? AND parent = ? AND name = ?",
            **{
                f"delete_index_{table}": f"DELETE FROM {ks}.{table} WHERE {' AND '.join(f'{c} = ?' for c in columns)}"
                for table, columns in INDEX_KEYS.items()
            },
            **{
                f"{name}{limited}": f"SELECT {column} FROM {ks}.{table} WHERE {' AND '.join(f'{c} = ?' for c in keys)}{limit}"
                for name, (table, column, keys) in LISTINGS.items()
                for limited, limit in LISTING_LIMITS
            },
            **{
                f"bucket_{name}{limited}": f"SELECT {column} FROM {ks}.{bucket_table(table)} WHERE tenant = ? AND bucket = ?"
                + "".join(f" AND {c} = ?" for c in keys[1:])
                + limit
                for name, (table, column, keys) in LISTINGS.items()
                for limited, limit in LISTING_LIMITS
            },
            **{
                f"buckets_of_{name}{'_value' if value else ''}": f"SELECT bucket FROM {ks}.{bucket_table(table)}"
                f" WHERE tenant = ? AND bucket IN ?{''.join(f' AND {c} = ?' for c in (*keys[1:], *([column] if value else [])))}"
                " PER PARTITION LIMIT 1"
                for name, (table, column, keys) in LISTINGS.items()
                for value in (False, True)
            },
            **{
                f"write_{bucket_table(table)}": f"INSERT INTO {ks}.{bucket_table(table)} ({', '.join(columns)})"
                f" VALUES ({', '.join('?' * len(columns))}) USING TTL ?"
                for table in BUCKET_TABLES
                for columns in [("tenant", "bucket", *INDEX_KEYS[table][1:])]
            },
        }

    def write_series(self, series: Sequence[SeriesKey]):
        return self._write_rows(lambda: self._all_time_requests(series))

    def _all_time_requests(self, series: Sequence[SeriesKey]) -> list[tuple]:
        """The all-time rows of the series, each with the TTL that ends it once their data
        expired (_all_time_ttl_s), unless written again meanwhile."""
        s, rows = self._statements, index_rows(series)
        ttls = {tenant: self._all_time_ttl_s(tenant) for (tenant,) in rows.tenants}
        return [
            *((s["tenant"], (*row, ttls[row[0]])) for row in rows.tenants),
            *((s["metric_name"], (*row, ttls[row[0]])) for row in rows.metric_names),
            *((s["series_set_hash"], (*row, ttls[row[0]])) for row in rows.series_set_hashes),
            *((s["series_set"], (*row, ttls[row[0]])) for row in rows.series_sets),
            *((s["tag_key"], (*row, ttls[row[0]])) for row in rows.tag_keys),
            *((s["tag_value"], (*row, ttls[row[0]])) for row in rows.tag_values),
            *(
                (s["path_leaf" if leaf else "path_branch"], (ttls[tenant], tenant, parent, name))
                for tenant, parent, name, leaf in rows.graphite_paths
            ),
            *((s["tenant_tag_key"], (*row, ttls[row[0]])) for row in rows.tenant_tag_keys),
            *((s["tenant_tag_value"], (*row, ttls[row[0]])) for row in rows.tenant_tag_values),
            *((s["tag_metric"], (*row, ttls[row[0]])) for row in rows.tag_metrics),
        ]

    def write_series_buckets(self, series_buckets: Sequence[tuple[SeriesKey, int]]):
        """Each row with a TTL that ends it the tenant's raw retention after its bucket ends; and
        the all-time rows of the series due a refresh (index.DailyRefresh), with a new TTL."""
        now, ttls = now_ms(), {}
        due = self._refresh.due(series_buckets)

        def requests() -> list:
            found = self._all_time_requests(due) + self._last_bucket_requests(series_buckets)
            for table, rows in bucket_index_rows(series_buckets).items():
                statement = self._statements[f"write_{table}"]
                for row in rows:
                    tenant, bucket = row[0], row[1]
                    if tenant not in ttls:
                        ttls[tenant] = self.retentions.for_tenant(tenant).raw_retention_ms
                    ttl_s = max(1, (bucket + INDEX_BUCKET_MS + ttls[tenant] - now) // 1000)
                    found.append((statement, (*row, ttl_s)))
            return found

        return self._write_rows(requests)

    def _last_bucket_requests(self, series_buckets: Sequence[tuple[SeriesKey, int]]) -> list[tuple]:
        """series_set_hashes.last_bucket of each series: the newest bucket of the call, written with
        the bucket's start (us) as its write time, so an older bucket indexed later (late data)
        never replaces a newer one; an admin delete's tombstone (written now) still hides it."""
        newest: dict[tuple[str, str], int] = {}
        for key, bucket in series_buckets:
            identity = (key.tenant, key.series_set_hash)
            newest[identity] = max(bucket, newest.get(identity, bucket))
        statement = self._statements["last_bucket"]
        return [
            (statement, (self._all_time_ttl_s(tenant), bucket * 1000, bucket, tenant, hash_))
            for (tenant, hash_), bucket in newest.items()
        ]

    def series_seen_since(self, tenant, hashes: Iterable[str], bucket: int):
        hashes = sorted(set(hashes))
        statement = self._statements["last_buckets"]
        chunks = [hashes[i : i + READ_SERIES_PER_REQUEST] for i in range(0, len(hashes), READ_SERIES_PER_REQUEST)]

        def seen(pages):
            return {
                row.series_set_hash
                for page in pages
                for row in page
                if row.metric_name is not None and (row.last_bucket is None or row.last_bucket >= bucket)
            }

        return self._execute_all([(statement, (tenant, chunk)) for chunk in chunks]).addCallback(seen)

    def _listing(self, name: str, keys: tuple, buckets: Buckets | None, most_rows: int | None = None):
        """One LISTINGS entry: one request to the all-time table, or one a bucket (a partition each)
        to the bucket table, united; sorted. Rows as plain tuples (PLAIN_ROWS): a churning tenant's
        bucket lists a series a row. With ``most_rows``, each request has a LIMIT of one row
        more, and a listing of more than BOUNDED_LISTING_REQUESTS buckets is not read (None)."""
        limited, extra = ("", ()) if most_rows is None else ("_limited", (most_rows + 1,))
        if buckets is None:
            requests = [(self._statements[f"{name}{limited}"], (*keys, *extra))]
        else:
            starts = list(buckets.starts())
            if most_rows is not None and len(starts) > BOUNDED_LISTING_REQUESTS:
                return defer.succeed(None)
            statement = self._statements[f"bucket_{name}{limited}"]
            requests = [(statement, (keys[0], bucket, *keys[1:], *extra)) for bucket in starts]

        def united(pages):
            if most_rows is not None and sum(len(page) for page in pages) > most_rows:
                return None
            return sorted({value for page in pages for (value,) in page})

        return self._execute_all(requests, PLAIN_ROWS).addCallback(united)

    def listings_with_rows(self, name, listings):
        """A request a listing, a row at most."""
        statement = self._statements[f"{name}_limited"]
        requests = [(statement, (*keys, 1)) for keys in listings]
        return self._execute_all(requests, PLAIN_ROWS).addCallback(lambda pages: [bool(page) for page in pages])

    def listings_buckets(self, name, listings, buckets):
        """A request a listing: ``bucket IN`` the buckets, a row at most a partition."""
        listings = list(listings)
        if not listings:
            return defer.succeed([])
        with_value = len(listings[0]) > len(LISTINGS[name][2])
        statement = self._statements[f"buckets_of_{name}{'_value' if with_value else ''}"]
        starts = list(buckets.starts())
        requests = [(statement, (keys[0], starts, *keys[1:])) for keys in listings]
        return self._execute_all(requests, PLAIN_ROWS).addCallback(
            lambda pages: [{bucket for (bucket,) in page} for page in pages]
        )

    def get_series(self, tenant, hashes: Iterable[str]):
        """READ_SERIES_PER_REQUEST series a request (``series_set_hash IN ?``): the downsampler
        asks for a whole sealing group at once."""
        hashes = sorted(set(hashes))
        statement = self._statements["get_series"]
        chunks = [hashes[i : i + READ_SERIES_PER_REQUEST] for i in range(0, len(hashes), READ_SERIES_PER_REQUEST)]

        def collect(pages):
            return {
                row.series_set_hash: SeriesKey(tenant, row.series_set_hash, row.metric_name, dict(row.tags or {}))
                for page in pages
                for row in page
                if row.metric_name is not None
            }

        return self._execute_all([(statement, (tenant, chunk)) for chunk in chunks]).addCallback(collect)

    def list_tenants(self):
        return self._execute(self._statements["list_tenants"]).addCallback(lambda rows: sorted(r.tenant for r in rows))

    def list_path_children(self, tenant, parent):
        def nodes(rows):
            return sorted(PathNode(r.name, bool(r.is_leaf), bool(r.is_branch)) for r in rows)

        return self._execute(self._statements["list_path_children"], (tenant, parent)).addCallback(nodes)

    def delete_index_rows(self, rows):
        requests = [(self._statements[f"delete_index_{table}"], key) for table, keys in rows.items() for key in keys]
        return self._write_rows(requests)

    def write_path_flags(self, tenant, parent, name, is_leaf, is_branch):
        if is_leaf or is_branch:
            ttl_s = self._all_time_ttl_s(tenant)
            return self._execute(self._statements["path_flags"], (ttl_s, is_leaf, is_branch, tenant, parent, name))
        return self._execute(self._statements["delete_index_graphite_paths"], (tenant, parent, name))
