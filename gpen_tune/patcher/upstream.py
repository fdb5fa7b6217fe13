"""The upstream checkout the patch set is written and checked against (no libcst: the CLI's help needs it)."""

UPSTREAM_REPO = "yangxy/GPEN"
UPSTREAM_COMMIT = "2c73670"
