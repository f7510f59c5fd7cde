"""`ClosedStructSchemaPlugin`: the published schema of a request body says what its decoder enforces.

Litestar writes a msgspec Struct's schema without ``additionalProperties``, so a body type that
forbids unknown fields (every request body here: an unknown field is a 400, never ignored) would
be published as accepting any. Clients generated from the schema, and schemathesis's valid
bodies, then send fields the server refuses.
"""

import msgspec
from litestar._openapi.schema_generation.plugins.struct import StructSchemaPlugin
from litestar.openapi.spec import Schema
from litestar.typing import FieldDefinition


class ClosedStructSchemaPlugin(StructSchemaPlugin):
    """Litestar's Struct schema, with ``additionalProperties: false`` where the Struct forbids unknown fields."""

    def to_openapi_schema(self, field_definition: FieldDefinition, schema_creator) -> Schema:
        """The Struct's component schema, closed where the Struct forbids unknown fields."""
        schema = super().to_openapi_schema(field_definition, schema_creator)
        if msgspec.inspect.type_info(field_definition.type_).forbid_unknown_fields:
            schema.additional_properties = False
        return schema
