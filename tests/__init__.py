"""plrl's test suite; a package so shared helpers import as `tests.infra`."""
