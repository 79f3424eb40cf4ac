"""Shared fixtures: shard factories and the real servers tests run against (S3, HTTP, and the
GCS, Azure and Hugging Face Hub stand-ins), servers that misbehave on purpose, and one shard
on every remote store."""

pytest_plugins = [
    "tests.fixtures.shards",
    "tests.fixtures.servers",
    "tests.fixtures.stores",
    "tests.fixtures.hostile",
    "tests.fixtures.remotes",
]
