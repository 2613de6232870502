"""The orchestration layer (docs/ARCHITECTURE.md, "Layers"): the worker loop and its leases, the
sweeper, and — in `engine.actions` — every state change that spans apps, one function and one
transaction each. It imports the domain apps; the interfaces (API, admin, console, commands)
import it; nothing in the domain imports it."""
