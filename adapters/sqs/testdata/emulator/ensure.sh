#!/usr/bin/env bash
# Makes sure the SQS emulator the adapters/sqs tests start is installed:
# node and npm (from Debian's packages when missing), then the pinned
# local-aws-sqs (npm ci from package-lock.json) when node_modules is
# missing. .ci/run calls it before make test; run it by hand once on a new
# machine.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	echo "[sqs-emulator] installing nodejs and npm" >&2
	(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm) >/dev/null \
		|| { echo "[sqs-emulator] FAIL: cannot install nodejs and npm from Debian's packages" >&2; exit 1; }
fi
if [ ! -d node_modules/local-aws-sqs ]; then
	echo "[sqs-emulator] npm ci" >&2
	npm ci --no-audit --no-fund --loglevel=error >&2 \
		|| { echo "[sqs-emulator] FAIL: npm ci in $(pwd)" >&2; exit 1; }
fi
node -e 'require("local-aws-sqs")' \
	|| { echo "[sqs-emulator] FAIL: node cannot load local-aws-sqs from $(pwd)/node_modules" >&2; exit 1; }
