"""runstate under other agent frameworks: :mod:`runstate.integrations.langgraph`."""
