"""Shared fixtures: shard factories and the real servers tests run against (S3, HTTP, and the
GCS, Azure and Hugging Face Hub stand-ins)."""

pytest_plugins = ["tests.fixtures.shards", "tests.fixtures.servers", "tests.fixtures.stores"]
