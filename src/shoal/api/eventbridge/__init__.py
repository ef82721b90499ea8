"""The EventBridge operations. Importing the modules registers their handlers on
`shoal.api.operations.eventbridge`."""


def register_all() -> None:
    from shoal.api.eventbridge import put_events, rules  # noqa: F401
