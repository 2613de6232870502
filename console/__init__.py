"""The live console (SPEC §13): pages, the websocket consumer, and the actions and
view-models they share."""
