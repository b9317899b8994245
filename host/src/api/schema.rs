//! What the OpenAPI document says beyond the handlers' annotations, from one
//! place: the string rules [`super::validate`] enforces (as JSON Schema
//! `pattern`s), the rules of the `Idempotency-Key` header and of path ids,
//! the error answers every operation can give, and this deployment's text
//! limit. A client generated from the document (or schemathesis, which CI
//! runs against it) then sends only what the server accepts, and expects
//! every status the server answers with.

use super::validate::{IDENTIFIER_PATTERN, NUL_FREE_PATTERN};
use crate::domain::{EventKind, ItemStatus};
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::schema::{
    AnyOfBuilder, ArrayBuilder, Object, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::{Components, OpenApi, Ref, RefOr, ResponseBuilder, content::Content};

/// Identifiers of the request bodies: 1-N characters, not blank, no control
/// characters but tab and newline.
const IDENTIFIERS: &[(&str, &str)] = &[
    ("SubmitRequest", "external_id"),
    ("SubmitRequest", "kind"),
    ("SubmitRequest", "author"),
    ("EventRequest", "actor"),
    ("ModerationRequest", "moderator"),
];

/// Free text of the request bodies: anything but NUL.
const FREE_TEXT: &[(&str, &str)] = &[
    ("SubmitRequest", "text"),
    ("EventRequest", "text"),
    ("ModerationRequest", "reason"),
    ("AuthorModerationRequest", "reason"),
    ("ReplaceListRequest", "reason"),
    ("PatchListRequest", "reason"),
    ("AppealRequest", "text"),
    ("AppealDecision", "reason"),
];

/// The item texts, whose length limit is a setting.
const ITEM_TEXTS: &[(&str, &str)] = &[("SubmitRequest", "text"), ("EventRequest", "text")];

/// The `Idempotency-Key` header: 1-255 printable ASCII characters, not all
/// spaces (see [`super::idempotency`]).
const IDEMPOTENCY_KEY_PATTERN: &str = "^[ -~]*[!-~][ -~]*$";

/// Completes a generated document: the string rules, this deployment's
/// `ingest.max_text_chars` as the texts' `maxLength`, `text` required for
/// an `edit` and refused for other events, and the error answers.
pub(super) fn complete(openapi: &mut OpenApi, max_text_chars: usize) {
    let components = openapi.components.get_or_insert_with(Default::default);
    for (schema, field) in IDENTIFIERS {
        with_property(components, schema, field, |p| {
            p.pattern = Some(IDENTIFIER_PATTERN.into())
        });
    }
    for (schema, field) in FREE_TEXT {
        with_property(components, schema, field, |p| p.pattern = Some(NUL_FREE_PATTERN.into()));
    }
    for (schema, field) in ITEM_TEXTS {
        with_property(components, schema, field, |p| p.max_length = Some(max_text_chars));
    }
    split_event_request(components);
    nul_free_context(components);
    if let Some(RefOr::T(Schema::Object(request))) = components.schemas.get_mut("ModerationRequest") {
        let targets = ItemStatus::ALL
            .iter()
            .filter(|s| super::moderation::may_set(**s))
            .map(|s| serde_json::json!(s.as_str()));
        request.properties.insert("status".into(), string_enum(targets));
    }
    for item in openapi.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.post,
            &mut item.put,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            constrain_parameters(operation);
            add_error_answers(operation);
        }
    }
}

/// `EventRequest` as one of two shapes: an `edit` with its `text`, or any
/// other kind without one (what [`super::events`] checks).
fn split_event_request(components: &mut Components) {
    let Some(RefOr::T(Schema::Object(event))) = components.schemas.get("EventRequest").cloned() else {
        panic!("the OpenAPI document has no object schema EventRequest");
    };
    let kinds = |kinds: &[EventKind]| string_enum(kinds.iter().map(|k| serde_json::json!(k.as_str())));
    let mut edit = event.clone();
    edit.properties.insert("kind".into(), kinds(&[EventKind::Edit]));
    edit.required.push("text".into());
    if let Some(RefOr::T(Schema::Object(text))) = edit.properties.get_mut("text") {
        text.schema_type = SchemaType::Type(Type::String);
    }
    let mut other = event;
    let others: Vec<EventKind> = EventKind::ALL
        .iter()
        .copied()
        .filter(|k| *k != EventKind::Edit)
        .collect();
    other.properties.insert("kind".into(), kinds(&others));
    other.properties.insert(
        "text".into(),
        RefOr::T(Schema::Object(ObjectBuilder::new().schema_type(Type::Null).build())),
    );
    let one_of = OneOfBuilder::new()
        .description(Some(
            "An interaction with an item: an `edit` carries the new `text`, other kinds carry none.",
        ))
        .item(Schema::Object(edit))
        .item(Schema::Object(other))
        .build();
    components
        .schemas
        .insert("EventRequest".into(), RefOr::T(Schema::OneOf(one_of)));
}

/// `context`: keys of at most 256 characters, and no string anywhere inside with a
/// NUL (what [`super::validate::json`] checks), as a recursive schema.
fn nul_free_context(components: &mut Components) {
    let nul_free = || {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(NUL_FREE_PATTERN))
    };
    let value = || Ref::from_schema_name("NulFreeJson");
    let json_value = AnyOfBuilder::new()
        .description(Some("Any JSON value whose strings and keys hold no NUL."))
        .item(ObjectBuilder::new().schema_type(SchemaType::Array(vec![Type::Null, Type::Boolean, Type::Number])))
        .item(nul_free())
        .item(ArrayBuilder::new().items(value()))
        .item(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .property_names(Some(nul_free()))
                .additional_properties(Some(value())),
        )
        .build();
    components
        .schemas
        .insert("NulFreeJson".into(), RefOr::T(Schema::AnyOf(json_value)));
    let context = ObjectBuilder::new()
        .schema_type(SchemaType::Array(vec![Type::Object, Type::Null]))
        .description(Some(
            "Free-form facts passed to rules as string pairs (other values as their JSON text).",
        ))
        .property_names(Some(nul_free().max_length(Some(256))))
        .additional_properties(Some(value()))
        .build();
    if let Some(RefOr::T(Schema::Object(request))) = components.schemas.get_mut("SubmitRequest") {
        request
            .properties
            .insert("context".into(), RefOr::T(Schema::Object(context)));
    }
}

fn string_enum(values: impl IntoIterator<Item = serde_json::Value>) -> RefOr<Schema> {
    RefOr::T(Schema::Object(
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(values))
            .build(),
    ))
}

fn with_property(components: &mut Components, schema: &str, field: &str, change: impl FnOnce(&mut Object)) {
    let Some(RefOr::T(Schema::Object(object))) = components.schemas.get_mut(schema) else {
        panic!("the OpenAPI document has no object schema {schema}");
    };
    let Some(RefOr::T(Schema::Object(property))) = object.properties.get_mut(field) else {
        panic!("the OpenAPI schema {schema} has no string property {field}");
    };
    change(property);
}

fn constrain_parameters(operation: &mut Operation) {
    for parameter in operation.parameters.iter_mut().flatten() {
        let Some(RefOr::T(Schema::Object(schema))) = parameter.schema.as_mut() else {
            continue;
        };
        // An optional parameter is absent, never the string `null`.
        if let SchemaType::Array(types) = &schema.schema_type
            && let [only] = types.iter().filter(|t| **t != Type::Null).collect::<Vec<_>>()[..]
        {
            schema.schema_type = SchemaType::Type(only.clone());
        }
        match (&parameter.parameter_in, parameter.name.as_str()) {
            (ParameterIn::Header, "Idempotency-Key") => {
                schema.min_length = Some(1);
                schema.max_length = Some(255);
                schema.pattern = Some(IDEMPOTENCY_KEY_PATTERN.into());
            }
            (ParameterIn::Path, "name") => {
                schema.min_length = Some(1);
                schema.max_length = Some(64);
                schema.pattern = Some(super::lists::LIST_NAME_PATTERN.into());
            }
            // Item ids, authors and provider names; numeric ids carry their
            // own type. An author's or a signal's client is a token name,
            // a signal's key an identifier too.
            (ParameterIn::Path, _) | (ParameterIn::Query, "client" | "key") if schema.format.is_none() => {
                schema.min_length = Some(1);
                schema.max_length = Some(256);
                schema.pattern = Some(IDENTIFIER_PATTERN.into());
            }
            _ => {}
        }
    }
}

/// The answers any operation of its kind can give, in the one error format:
/// 400 for a malformed path, query, header or field; 401/403 where a token is
/// needed; 413/415/422 where there is a body; 503 while the store is away.
fn add_error_answers(operation: &mut Operation) {
    let mut answers = Vec::new();
    if operation.parameters.is_some() || operation.request_body.is_some() {
        answers.push(("400", "malformed path, query, header or field"));
    }
    if operation.security.is_some() {
        answers.push(("401", "missing or unknown token"));
        answers.push(("403", "the token's role may not call this"));
        answers.push(("503", "the store is unavailable; retry"));
    }
    if operation.request_body.is_some() {
        answers.push(("413", "body over `ingest.max_body_bytes`"));
        answers.push(("415", "not `Content-Type: application/json`"));
        answers.push(("422", "JSON that does not fit the schema"));
    }
    for (status, description) in answers {
        operation
            .responses
            .responses
            .entry(status.to_string())
            .or_insert_with(|| {
                ResponseBuilder::new()
                    .description(description)
                    .content(
                        "application/json",
                        Content::new(Some(RefOr::Ref(utoipa::openapi::Ref::from_schema_name("ErrorBody")))),
                    )
                    .build()
                    .into()
            });
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    fn document(max_text_chars: usize) -> Value {
        serde_json::from_str(&super::super::openapi_json(max_text_chars)).unwrap()
    }

    #[test]
    fn the_document_carries_the_deployments_text_limit_and_the_string_rules() {
        let doc = document(1234);
        let submit = &doc["components"]["schemas"]["SubmitRequest"]["properties"];
        assert_eq!(submit["text"]["maxLength"], 1234);
        assert_eq!(submit["author"]["pattern"], super::IDENTIFIER_PATTERN);
        let event = doc["components"]["schemas"]["EventRequest"]["oneOf"]
            .as_array()
            .unwrap();
        assert_eq!(event.len(), 2);
        assert_eq!(event[0]["properties"]["kind"]["enum"], serde_json::json!(["edit"]));
        assert!(event[0]["required"].as_array().unwrap().contains(&"text".into()));
        assert_eq!(event[1]["properties"]["text"]["type"], "null");
        let targets = &doc["components"]["schemas"]["ModerationRequest"]["properties"]["status"]["enum"];
        assert_eq!(
            targets,
            &serde_json::json!(["visible", "held_for_review", "rejected", "deleted"])
        );
    }

    #[test]
    fn every_secured_operation_documents_its_error_answers() {
        let doc = document(10);
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let answers = op["responses"].as_object().unwrap();
                if op.get("security").is_some() {
                    for status in ["401", "403", "503"] {
                        assert!(answers.contains_key(status), "{method} {path} lacks {status}");
                    }
                }
                if op.get("requestBody").is_some() {
                    for status in ["400", "413", "415", "422"] {
                        assert!(answers.contains_key(status), "{method} {path} lacks {status}");
                    }
                }
            }
        }
    }
}
