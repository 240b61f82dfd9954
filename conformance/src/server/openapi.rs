//! `init --from-openapi`: seeds a manifest from an OpenAPI 3.x document.
//!
//! Every operation that declares an `Idempotency-Key` header parameter
//! becomes an endpoint; its JSON body template comes from the request
//! body's example, else from its schema (`$ref`s followed): the amount-like
//! integer becomes `{{amount}}`, one free-text string the run marker
//! `{{marker}}`, and every other required string a caller var to fill in.
//! The security schemes become two callers' headers with placeholder
//! secrets. When a GET on the same path filters by the marker's field and
//! answers a list, that listing is the effect probe; otherwise the created
//! resource's id is. What the document cannot say is left as `FILL_ME`
//! with a comment, and `list` then shows what will run.

use std::collections::BTreeMap;

use idem_spec::manifest::{
    Caller, EffectProbe, Endpoint, Hooks, Limits, Manifest, ProfileDecl, Target,
};
use serde_json::{Map, Value, json};

use crate::Error;

/// The placeholder for every value the document cannot give.
pub const FILL_ME: &str = "FILL_ME";

/// What seeding found: the manifest and the notes to print beside it.
#[derive(Debug, Clone)]
pub struct Seeded {
    /// The manifest (placeholders where the document says nothing).
    pub manifest: Manifest,
    /// One line per thing the user must check or fill in.
    pub notes: Vec<String>,
}

/// Resolves a local `$ref` (`#/components/...`), at most 16 levels deep.
fn resolve<'a>(doc: &'a Value, mut v: &'a Value) -> &'a Value {
    for _ in 0..16 {
        let Some(r) = v.get("$ref").and_then(Value::as_str) else {
            return v;
        };
        match r.strip_prefix('#').and_then(|p| doc.pointer(p)) {
            Some(next) => v = next,
            None => return v,
        }
    }
    v
}

fn type_is(schema: &Value, t: &str) -> bool {
    match schema.get("type") {
        Some(Value::String(s)) => s == t,
        Some(Value::Array(a)) => a.iter().any(|x| x.as_str() == Some(t)),
        _ => false,
    }
}

/// Names a free-text field carrying the marker is likely to have.
const MARKER_NAMES: [&str; 10] = [
    "memo",
    "reference",
    "description",
    "note",
    "notes",
    "comment",
    "marker",
    "label",
    "statement_descriptor",
    "title",
];

fn is_key_param(doc: &Value, p: &Value) -> bool {
    let p = resolve(doc, p);
    p.get("in").and_then(Value::as_str) == Some("header")
        && p.get("name")
            .and_then(Value::as_str)
            .is_some_and(|n| n.eq_ignore_ascii_case(idem_spec::headers::IDEMPOTENCY_KEY))
}

/// A value for a schema without an example: the type's plainest value.
fn plain(doc: &Value, schema: &Value, depth: usize) -> Value {
    let s = resolve(doc, schema);
    if let Some(e) = s.get("example") {
        return e.clone();
    }
    if let Some(e) = s
        .get("enum")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    {
        return e.clone();
    }
    if depth > 4 {
        return Value::Null;
    }
    if type_is(s, "object") || s.get("properties").is_some() {
        let mut m = Map::new();
        let required = required_of(s);
        if let Some(props) = s.get("properties").and_then(Value::as_object) {
            for (k, v) in props.iter().filter(|(k, _)| required.contains(k)) {
                m.insert(k.clone(), plain(doc, v, depth + 1));
            }
        }
        Value::Object(m)
    } else if type_is(s, "array") {
        json!([])
    } else if type_is(s, "integer") || type_is(s, "number") {
        json!(1)
    } else if type_is(s, "boolean") {
        json!(false)
    } else if s.get("format").and_then(Value::as_str) == Some("uuid") {
        json!("{{uuid}}")
    } else {
        json!("string")
    }
}

fn required_of(s: &Value) -> Vec<String> {
    s.get("required")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The body template of an operation's JSON request body, the names of the
/// caller vars it uses, and the field carrying the marker (if any).
fn body_template(
    doc: &Value,
    op: &Value,
    preferred_marker: &[String],
) -> (Value, Vec<String>, Option<String>) {
    let Some(media) = json_media(doc, op) else {
        return (json!({}), Vec::new(), None);
    };
    let schema = media.get("schema").map(|s| resolve(doc, s));
    let props: Map<String, Value> = schema
        .and_then(|s| s.get("properties"))
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let required = schema.map(required_of).unwrap_or_default();
    let mut body = match media_example(doc, media) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let from_example = !body.is_empty();
    let marker = marker_field(doc, &props, &required, preferred_marker, &body);
    let amount = amount_field(doc, &props, &body);
    for (field, template) in [(&amount, "{{amount}}"), (&marker, "{{marker}}")] {
        if let Some(f) = field
            && body.contains_key(f)
        {
            body.insert(f.clone(), json!(template));
        }
    }
    let mut vars = Vec::new();
    for (k, v) in &props {
        let v = resolve(doc, v);
        if Some(k) == marker.as_ref() {
            body.insert(k.clone(), json!("{{marker}}"));
        } else if Some(k) == amount.as_ref() {
            body.insert(k.clone(), json!("{{amount}}"));
        } else if !required.contains(k) || (from_example && body.contains_key(k)) {
            // Optional fields stay out; an example's values stay as given.
        } else if type_is(v, "string")
            && v.get("enum").is_none()
            && v.get("format").and_then(Value::as_str) != Some("uuid")
        {
            // A required string the document cannot fill for each caller
            // (an account, a customer): a caller var.
            body.insert(k.clone(), json!(format!("{{{{{k}}}}}")));
            vars.push(k.clone());
        } else {
            body.insert(k.clone(), plain(doc, v, 1));
        }
    }
    let mut body = Value::Object(body);
    strip_nulls(&mut body);
    (body, vars, marker)
}

/// The operation's JSON request body media type object, if it has one.
fn json_media<'a>(doc: &'a Value, op: &'a Value) -> Option<&'a Value> {
    op.pointer("/requestBody")
        .map(|b| resolve(doc, b))
        .and_then(|b| b.get("content"))
        .and_then(Value::as_object)
        .and_then(|c| {
            c.iter()
                .find(|(k, _)| k.starts_with("application/json") || k.ends_with("+json"))
                .map(|(_, v)| v)
        })
}

/// The media type's `example`, else the value of its first `examples`.
fn media_example(doc: &Value, media: &Value) -> Option<Value> {
    media.get("example").cloned().or_else(|| {
        media
            .get("examples")
            .and_then(Value::as_object)
            .and_then(|e| e.values().next())
            .map(|e| resolve(doc, e))
            .and_then(|e| e.get("value").cloned())
    })
}

/// The field carrying the marker: a string a listing filters by, else a
/// free-text name, else any optional plain string the schema has; with no
/// schema to go by, a free-text member of the example by a known name.
fn marker_field(
    doc: &Value,
    props: &Map<String, Value>,
    required: &[String],
    preferred: &[String],
    example: &Map<String, Value>,
) -> Option<String> {
    let string_prop = |k: &str| {
        props
            .get(k)
            .is_some_and(|v| type_is(resolve(doc, v), "string"))
    };
    preferred
        .iter()
        .find(|k| string_prop(k))
        .cloned()
        .or_else(|| {
            MARKER_NAMES
                .iter()
                .find(|k| string_prop(k))
                .map(|k| (*k).to_owned())
        })
        .or_else(|| {
            props
                .iter()
                .find(|(k, v)| {
                    !required.contains(k)
                        && type_is(resolve(doc, v), "string")
                        && resolve(doc, v).get("enum").is_none()
                        && resolve(doc, v).get("format").is_none()
                })
                .map(|(k, _)| k.clone())
        })
        .or_else(|| {
            MARKER_NAMES
                .iter()
                .find(|k| example.get(**k).is_some_and(Value::is_string))
                .map(|k| (*k).to_owned())
        })
}

/// The integer field drawn per request: `amount` if the schema has it as
/// an integer, else its first integer; with no schema to go by, the
/// example's integer `amount`.
fn amount_field(
    doc: &Value,
    props: &Map<String, Value>,
    example: &Map<String, Value>,
) -> Option<String> {
    props
        .iter()
        .find(|(k, v)| k.as_str() == "amount" && type_is(resolve(doc, v), "integer"))
        .or_else(|| {
            props
                .iter()
                .find(|(_, v)| type_is(resolve(doc, v), "integer"))
        })
        .map(|(k, _)| k.clone())
        .or_else(|| {
            example
                .get("amount")
                .filter(|v| v.is_i64())
                .map(|_| "amount".to_owned())
        })
}

/// TOML has no null: members whose value is null are dropped.
fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => {
            a.retain(|x| !x.is_null());
            a.iter_mut().for_each(strip_nulls);
        }
        _ => {}
    }
}

/// The listing that counts this endpoint's effects by the marker field:
/// a GET on the same path with a query parameter of that name, answering
/// an array (or an object holding one).
fn list_probe(doc: &Value, path: &str, marker_field: &str) -> Option<EffectProbe> {
    let get = doc.pointer(&format!(
        "/paths/{}/get",
        path.replace('~', "~0").replace('/', "~1")
    ))?;
    let filters = get
        .get("parameters")
        .and_then(Value::as_array)?
        .iter()
        .map(|p| resolve(doc, p))
        .any(|p| {
            p.get("in").and_then(Value::as_str) == Some("query")
                && p.get("name").and_then(Value::as_str) == Some(marker_field)
        });
    if !filters {
        return None;
    }
    let schema = get
        .pointer("/responses/200/content")
        .and_then(Value::as_object)
        .and_then(|c| c.values().next())
        .and_then(|m| m.get("schema"))
        .map(|s| resolve(doc, s))?;
    let items_pointer = if type_is(schema, "array") {
        String::new()
    } else {
        let (name, _) = schema
            .get("properties")
            .and_then(Value::as_object)?
            .iter()
            .find(|(_, v)| type_is(resolve(doc, v), "array"))?;
        format!("/{name}")
    };
    Some(EffectProbe::List {
        url: format!("{path}?{marker_field}={{{{marker}}}}"),
        items_pointer,
        match_pointer: format!("/{marker_field}"),
        match_on: Default::default(),
        caller: None,
    })
}

/// The headers one caller sends, from the document's security schemes.
fn auth_headers(doc: &Value, who: &str) -> (BTreeMap<String, String>, Vec<String>) {
    let mut headers = BTreeMap::new();
    let mut notes = Vec::new();
    let schemes = doc
        .pointer("/components/securitySchemes")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (name, s) in &schemes {
        let s = resolve(doc, s);
        let secret = format!("{FILL_ME}-{who}-{name}");
        match (
            s.get("type").and_then(Value::as_str),
            s.get("scheme").and_then(Value::as_str),
        ) {
            (Some("http"), Some(b)) if b.eq_ignore_ascii_case("bearer") => {
                headers.insert("Authorization".into(), format!("Bearer {secret}"));
            }
            (Some("http"), Some(b)) if b.eq_ignore_ascii_case("basic") => {
                headers.insert("Authorization".into(), format!("Basic {secret}"));
            }
            (Some("apiKey"), _) if s.get("in").and_then(Value::as_str) == Some("header") => {
                if let Some(h) = s.get("name").and_then(Value::as_str) {
                    headers.insert(h.to_owned(), secret);
                }
            }
            (Some("oauth2" | "openIdConnect"), _) => {
                headers.insert("Authorization".into(), format!("Bearer {secret}"));
            }
            (t, _) => notes.push(format!(
                "security scheme {name:?} ({}) cannot be sent as a header; give callers' credentials by hand",
                t.unwrap_or("no type")
            )),
        }
    }
    if headers.is_empty() {
        headers.insert("Authorization".into(), format!("Bearer {FILL_ME}-{who}"));
    }
    (headers, notes)
}

/// Seeds a manifest from an OpenAPI 3.x document (JSON).
pub fn seed(text: &str, origin: &str) -> Result<Seeded, Error> {
    seed_with(text, origin, &[])
}

/// Whether an operation is one `keyed` names: `METHOD /path` (any case for
/// the method) or its `operationId`.
fn named(keyed: &[String], method: &str, path: &str, op: &Value) -> bool {
    keyed.iter().any(|k| {
        let k = k.trim();
        op.get("operationId").and_then(Value::as_str) == Some(k)
            || k.split_once(' ')
                .is_some_and(|(m, p)| m.eq_ignore_ascii_case(method) && p.trim() == path)
    })
}

/// Reads an OpenAPI document as JSON, else as YAML.
pub fn parse_document(text: &str, origin: &str) -> Result<Value, Error> {
    match serde_json::from_str::<Value>(text) {
        Ok(v) => Ok(v),
        Err(json_err) => serde_saphyr::from_str::<Value>(text).map_err(|yaml_err| {
            Error::ManifestParse {
                path: origin.to_owned(),
                message: format!(
                    "neither a JSON nor a YAML OpenAPI document (as JSON: {json_err}; as YAML: {yaml_err})"
                ),
            }
        }),
    }
}

/// [`seed`], also treating the operations `keyed` names as keyed: a
/// middleware that reads `Idempotency-Key` seldom declares the header, so
/// the document alone cannot say which operations use it.
///
/// The notes come out in the order a reader fills the file in: per
/// operation (key grammar, marker), then callers, probe and base URL.
pub fn seed_with(text: &str, origin: &str, keyed: &[String]) -> Result<Seeded, Error> {
    let doc = parse_document(text, origin)?;
    require_openapi_3(&doc, origin)?;
    let mut notes = Vec::new();
    let mut endpoints = Vec::new();
    let mut all_vars: Vec<String> = Vec::new();
    let mut seeded_key = idem_spec::manifest::KeyDecl::default();
    let paths = doc
        .get("paths")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    for (path, item) in &paths {
        let shared: Vec<Value> = item
            .get("parameters")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for method in ["post", "put", "patch", "delete"] {
            let Some(op) = item.get(method) else { continue };
            let params: Vec<&Value> = shared
                .iter()
                .chain(
                    op.get("parameters")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten(),
                )
                .collect();
            let declared = params.iter().any(|p| is_key_param(&doc, p));
            if !declared && !named(keyed, method, path, op) {
                continue;
            }
            if let Some(k) = params
                .iter()
                .find(|p| is_key_param(&doc, p))
                .and_then(|p| resolve(&doc, p).get("schema"))
            {
                key_grammar(&doc, k, &mut seeded_key, &mut notes);
            }
            let operation = Operation {
                path,
                item,
                method,
                op,
                params: &params,
            };
            endpoints.push(seeded_endpoint(&doc, &operation, &mut all_vars, &mut notes));
        }
    }
    if endpoints.is_empty() {
        return Err(Error::ManifestInvalid(format!(
            "{origin}: no operation declares an Idempotency-Key header parameter, so there is nothing to check; declare it on your idempotent operations (the contract asks for that: idem.key.endpoints-published), or name them with --keyed 'POST /payments' (or an operationId), as for a middleware that reads the header without declaring it"
        )));
    }
    all_vars.sort();
    all_vars.dedup();
    let callers = seeded_callers(&doc, &all_vars, &mut notes);
    let (main_probe, endpoints) = share_probe(endpoints, &mut notes);
    let base_url = seeded_base_url(&doc, &mut notes);
    let name = doc
        .pointer("/info/title")
        .and_then(Value::as_str)
        .unwrap_or("my API")
        .to_owned();
    let manifest = Manifest {
        target: Target {
            name: format!("{name} (sandbox)"),
            base_url,
            openapi_url: None,
        },
        profile: ProfileDecl::default(),
        callers,
        endpoints,
        policy: Default::default(),
        probe: main_probe,
        hooks: Hooks::default(),
        key: seeded_key,
        limits: Limits::default(),
        waivers: Vec::new(),
    };
    Ok(Seeded { manifest, notes })
}

/// Refuses anything but an OpenAPI 3.x document.
fn require_openapi_3(doc: &Value, origin: &str) -> Result<(), Error> {
    let version = match doc.get("openapi") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => String::new(),
    };
    if !version.starts_with('3') {
        return Err(Error::ManifestInvalid(format!(
            "{origin}: an OpenAPI 3.x document is needed (\"openapi\": \"3...\"), found {version:?}"
        )));
    }
    Ok(())
}

/// One keyed operation of the document, as seeding reads it.
struct Operation<'a> {
    /// Its path as the document spells it (`/accounts/{id}/payments`).
    path: &'a str,
    /// The path item, for the GET beside the operation.
    item: &'a Value,
    /// Lower case, as a path item's member name.
    method: &'a str,
    op: &'a Value,
    /// The path item's shared parameters, then the operation's own.
    params: &'a [&'a Value],
}

/// The endpoint one keyed operation becomes, with the listing that counts
/// its effects if the document has one. Its path parameters and the body's
/// required strings join `vars`; what is missing becomes a note.
fn seeded_endpoint(
    doc: &Value,
    o: &Operation<'_>,
    vars: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> (Endpoint, Option<EffectProbe>) {
    let filters: Vec<String> = o
        .item
        .pointer("/get/parameters")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| resolve(doc, p))
        .filter(|p| p.get("in").and_then(Value::as_str) == Some("query"))
        .filter_map(|p| p.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    let (body, body_vars, marker) = body_template(doc, o.op, &filters);
    let templated = templated_path(o.path, vars);
    vars.extend(body_vars);
    let name =
        o.op.get("operationId")
            .or_else(|| o.op.get("summary"))
            .and_then(Value::as_str)
            .map_or_else(
                || format!("{} {}", o.method.to_uppercase(), o.path),
                str::to_owned,
            );
    let probe = marker.as_deref().and_then(|m| list_probe(doc, o.path, m));
    let path = o.path;
    match &marker {
        None => notes.push(format!(
            "{name}: no free-text string in the body to carry the run marker; add one (or a header, endpoints[].headers) and a probe that finds it"
        )),
        Some(m) if probe.is_none() => notes.push(format!(
            "{name}: the marker goes in {m:?}, but no GET {path}?{m}= listing was found; declare a probe that counts effects by it"
        )),
        Some(_) => {}
    }
    let endpoint = Endpoint {
        name,
        method: o.method.to_uppercase(),
        path: templated,
        body,
        key_required: o.params.iter().any(|p| {
            is_key_param(doc, p)
                && resolve(doc, p).get("required").and_then(Value::as_bool) == Some(true)
        }),
        // Nothing in a document says which body the API refuses
        // after claiming the key, or fails on: placeholders the
        // preflight refuses to run with until they are filled in
        // (or the lines deleted, leaving those cases unsupported).
        rejected_body: Some(Value::String(format!(
            "{FILL_ME}: a body this endpoint refuses with a final 4xx after claiming the key (or delete the line)"
        ))),
        replayed_headers: Vec::new(),
        probe: None,
        server_error_body: Some(Value::String(format!(
            "{FILL_ME}: a body this endpoint fails on with a 5xx after claiming the key (or delete the line)"
        ))),
        amounts: Default::default(),
        headers: BTreeMap::new(),
    };
    (endpoint, probe)
}

/// The path with each `{param}` as a `{{param}}` caller var, the names
/// pushed onto `vars`.
fn templated_path(path: &str, vars: &mut Vec<String>) -> String {
    let mut templated = path.to_owned();
    for seg in path.split('/') {
        if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
            templated = templated.replace(seg, &format!("{{{{{name}}}}}"));
            vars.push(name.to_owned());
        }
    }
    templated
}

/// Two callers with placeholder credentials from the security schemes and
/// a placeholder for each var; the notes say what to fill in.
fn seeded_callers(doc: &Value, all_vars: &[String], notes: &mut Vec<String>) -> Vec<Caller> {
    let callers: Vec<Caller> = ["caller-a", "caller-b"]
        .iter()
        .map(|who| {
            let (headers, n) = auth_headers(doc, who);
            // Both callers meet the same schemes: say it once.
            if *who == "caller-a" {
                notes.extend(n);
            }
            Caller {
                name: (*who).to_owned(),
                headers,
                vars: all_vars
                    .iter()
                    .map(|v| (v.clone(), format!("{FILL_ME}-{who}-{v}")))
                    .collect(),
                signing: None,
            }
        })
        .collect();
    if !all_vars.is_empty() {
        notes.push(format!(
            "each caller's vars ({}) need values that caller may use (its own accounts, customers...)",
            all_vars.join(", ")
        ));
    }
    notes.push(
        "each caller's headers need real credentials of two different identities (a sandbox)"
            .into(),
    );
    callers
}

/// The manifest's probe and the endpoints: the first endpoint's listing
/// is the manifest's probe; the others keep their own when they differ.
fn share_probe(
    endpoints: Vec<(Endpoint, Option<EffectProbe>)>,
    notes: &mut Vec<String>,
) -> (EffectProbe, Vec<Endpoint>) {
    let main_probe = endpoints[0].1.clone().unwrap_or_else(|| {
        notes.push(
            "no listing found for the first endpoint: the probe reads the created resource's id at /id; a count or list probe is stronger".into(),
        );
        EffectProbe::ResourceId {
            id_pointer: "/id".into(),
        }
    });
    let endpoints: Vec<Endpoint> = endpoints
        .into_iter()
        .enumerate()
        .map(|(i, (mut e, p))| {
            if i > 0 && p.as_ref() != Some(&main_probe) {
                e.probe = p;
            }
            e
        })
        .collect();
    (main_probe, endpoints)
}

/// The document's first absolute server URL, else a local placeholder and
/// a note.
fn seeded_base_url(doc: &Value, notes: &mut Vec<String>) -> String {
    doc.pointer("/servers/0/url")
        .and_then(Value::as_str)
        .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
        .map_or_else(
            || {
                notes.push("the document names no absolute server URL: set target.base_url to your sandbox".into());
                "http://127.0.0.1:8080".to_owned()
            },
            |u| u.trim_end_matches('/').to_owned(),
        )
}

/// The key grammar the header parameter's schema states (`format: uuid`,
/// `maxLength`); a `pattern` cannot be mapped and becomes a note.
fn key_grammar(
    doc: &Value,
    schema: &Value,
    key: &mut idem_spec::manifest::KeyDecl,
    notes: &mut Vec<String>,
) {
    let schema = resolve(doc, schema);
    if schema.get("format").and_then(Value::as_str) == Some("uuid") {
        key.format = idem_spec::manifest::KeyFormat::Uuid;
    }
    if let Some(n) = schema.get("maxLength").and_then(Value::as_u64)
        && key.format != idem_spec::manifest::KeyFormat::Uuid
    {
        key.max_len = u16::try_from(n.min(255)).ok();
    }
    if let Some(p) = schema.get("pattern").and_then(Value::as_str) {
        let note = format!(
            "the Idempotency-Key schema has the pattern {p:?}: declare it in [key] (format, prefix, charset, max_len)"
        );
        if !notes.contains(&note) {
            notes.push(note);
        }
    }
}

/// The seeded manifest as commented TOML: what was found, what to fill in,
/// and where the documented template lives.
pub fn render(seeded: &Seeded, origin: &str) -> Result<String, Error> {
    let body = toml::to_string_pretty(&seeded.manifest)
        .map_err(|e| Error::Seed(format!("cannot write the manifest: {e}")))?;
    let mut s = format!(
        "# idem-conformance target manifest, seeded from {origin}.\n\
         # Every value {FILL_ME}... is for you to fill in. Every field is documented in the\n\
         # template `idem-conformance init template.toml` writes; the profile, policy, hooks\n\
         # and limits below are the defaults: declare your own dialect there.\n\
         # Then: idem-conformance list --target THIS-FILE   (sends nothing)\n#\n"
    );
    for n in &seeded.notes {
        s.push_str(&format!("# TODO: {n}\n"));
    }
    s.push('\n');
    s.push_str(&body);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_keyed_operations_and_the_key_grammar_are_read() {
        // A FastAPI-style document: the middleware reads the header, the
        // document never declares it.
        let yaml = "openapi: 3.1.0\ninfo:\n  title: Shop\npaths:\n  /orders:\n    post:\n      operationId: create_order\n      requestBody:\n        content:\n          application/json:\n            example: {amount: 5, note: hi}\n";
        let e = seed(yaml, "x.yaml").expect_err("nothing declares the header");
        assert!(e.to_string().contains("--keyed"), "{e}");
        for keyed in ["POST /orders", "post /orders", "create_order"] {
            let s = seed_with(yaml, "x.yaml", &[keyed.to_owned()]).expect(keyed);
            assert_eq!(s.manifest.endpoints[0].path, "/orders", "{keyed}");
            // The failure bodies are placeholders the preflight refuses.
            let rejected = s.manifest.endpoints[0]
                .rejected_body
                .as_ref()
                .expect("placeholder");
            assert!(rejected.as_str().is_some_and(|t| t.starts_with(FILL_ME)));
        }
        // The header's schema gives the key grammar.
        let json = r#"{"openapi":"3.0.3","paths":{"/p":{"post":{"parameters":[{"in":"header","name":"Idempotency-Key","required":true,"schema":{"type":"string","format":"uuid"}}],"requestBody":{"content":{"application/json":{"example":{"amount":1,"memo":"m"}}}}}}}}"#;
        let s = seed(json, "x.json").expect("seeds");
        assert_eq!(s.manifest.key.format, idem_spec::manifest::KeyFormat::Uuid);
        let json = json.replace(
            r#""format":"uuid""#,
            r#""maxLength":64,"pattern":"^[a-z]+$""#,
        );
        let s = seed(&json, "x.json").expect("seeds");
        assert_eq!(s.manifest.key.max_len, Some(64));
        assert!(
            s.notes.iter().any(|n| n.contains("pattern")),
            "{:?}",
            s.notes
        );
    }

    #[test]
    fn refuses_what_it_cannot_use() {
        assert!(
            seed("openapi: [", "x.yaml").is_err(),
            "neither JSON nor YAML"
        );
        assert!(seed(r#"{"swagger": "2.0"}"#, "x").is_err(), "Swagger 2");
        let none = r#"{"openapi": "3.0.3", "paths": {"/a": {"post": {}}}}"#;
        let e = seed(none, "x").expect_err("no idempotent operation");
        assert!(e.to_string().contains("Idempotency-Key"), "{e}");
    }
}
