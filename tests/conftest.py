"""Shared fixtures: shard factories and the real servers (S3, HTTP) tests run against."""

pytest_plugins = ["tests.fixtures.shards", "tests.fixtures.servers", "tests.fixtures.stores"]
