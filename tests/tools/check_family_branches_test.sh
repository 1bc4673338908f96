#!/usr/bin/env bash
# check_family_branches.sh must fail on a branch on the family: a copy of the tree with a
# compare against the core's enum in the loader, and one against the proto's in the
# config reader.
set -euo pipefail
root="$(cd "${1:-.}" && pwd)"
scratch="$(mktemp -d)"
trap 'rm -rf "${scratch}"' EXIT
for branch in "core/encoder/transformer_encoder.cc:if (spec.family == EncoderSpec::Family::kGte) {}" \
              "server/models/encoder_config.cc:bool gte = f == v1::EncoderConfig::FAMILY_GTE;"; do
  copy="${scratch}/copy"
  rm -rf "${copy}"
  mkdir -p "${copy}"
  cp -r "${root}/core" "${root}/server" "${copy}/"
  echo "${branch#*:}" >> "${copy}/${branch%%:*}"
  if bash "${root}/tests/tools/check_family_branches.sh" "${copy}" > /dev/null 2>&1; then
    echo "check_family_branches_test: '${branch}' was not caught" >&2
    exit 1
  fi
done
bash "${root}/tests/tools/check_family_branches.sh" "${root}"
echo "check_family_branches_test: every branch was caught"
