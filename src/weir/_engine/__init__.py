"""The engine: weir's private modules (the owner loop and its parts). Nothing here is public
API; what users need is exported from `weir` and the public modules (docs/architecture.md).

Loggers keep their public names: `weir._engine.failures` logs as `weir.failures`
(`weir.logs.get_logger`)."""
