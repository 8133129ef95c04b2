//! The web dashboard: the files of `web/dist` (built from `web/src` by `npm run build` and
//! committed), built into the binary so that it works with no network and no files beside it.
//! `scripts/test` rebuilds them and fails if they differ from the commit.
//!
//! The dashboard's files are served without the bearer token (a browser cannot send one for a
//! page load); the page asks for the token when the API answers 401 and sends it with every
//! request it makes.

use axum::extract::Path;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

const INDEX: &[u8] = include_bytes!("../../../web/dist/index.html");

/// The files under `/assets/`: name, content type, bytes.
const ASSETS: &[(&str, &str, &[u8])] = &[
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../../../web/dist/assets/app.js"),
    ),
    (
        "index.css",
        "text/css; charset=utf-8",
        include_bytes!("../../../web/dist/assets/index.css"),
    ),
];

/// `GET /`, `GET /index.html` and `GET /assets/{file}`.
pub(crate) fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(index))
        .route("/index.html", get(index))
        .route("/assets/{file}", get(asset))
}

async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, bytes)) => file(content_type, bytes),
        None => (StatusCode::NOT_FOUND, format!("no dashboard file {name}")).into_response(),
    }
}

/// The file names carry no content hash: browsers revalidate on every load.
fn file(content_type: &'static str, bytes: &'static [u8]) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        bytes,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_loads_exactly_the_assets_built_in() {
        let page = std::str::from_utf8(INDEX).expect("index.html is UTF-8");
        let mut referenced: Vec<&str> = page
            .split("./assets/")
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .collect();
        referenced.sort_unstable();
        let mut served: Vec<&str> = ASSETS.iter().map(|(n, _, _)| *n).collect();
        served.sort_unstable();
        assert_eq!(referenced, served, "web/dist/index.html against ASSETS");
        for (name, _, bytes) in ASSETS {
            assert!(!bytes.is_empty(), "{name} is empty");
        }
    }
}
