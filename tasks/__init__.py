"""Prefect tasks: thin wrappers, each calling the engine and passing typed values.

Only tasks that touch the outside world (the dataset download) get retries. Tasks that
take large in-memory objects (tensors, a federation) use ``NO_CACHE`` so Prefect never
tries to hash them.
"""

__all__: list[str] = []
