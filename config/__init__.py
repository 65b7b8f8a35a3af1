"""The params layer: params.yaml read once into validated models (:mod:`config.params`),
the error types every shell layer shares (:mod:`config.errors`) and the process
environment the entry points set (:mod:`config.environment`). Below ``tasks``, above the
engine; importing it changes nothing."""

__all__: list[str] = []
