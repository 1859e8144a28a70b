"""Clients of colocate's daemons: one kept CURVE connection (``rpc``), the scheduler's (``scheduler``) and a node operator endpoint's (``node``)."""
