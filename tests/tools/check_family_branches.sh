#!/usr/bin/env bash
# A family is a row: no code outside the family table names one family's value.
# core/encoder/encoder_family.{h,cc} hold the rows, core/encoder/encoder_spec.h the
# enum; the config reader's table of per-family readers (kConfigReaders in
# server/models/encoder_config.cc) is the rows' config side. Anywhere else in core/ or
# server/, `Family::kX` or a proto `FAMILY_X` other than FAMILY_UNSPECIFIED is a branch
# on the family, and fails here.
set -euo pipefail
root="$(cd "${1:-.}" && pwd)"
cd "${root}"
found="$(grep -rnE 'Family::k[A-Z]|\bFAMILY_[A-Z]' core server \
           --include='*.cc' --include='*.h' --include='*.cu' \
         | grep -vE '^core/encoder/encoder_family\.(h|cc):|^core/encoder/encoder_spec\.h:' \
         | grep -vE 'FAMILY_UNSPECIFIED' \
         | grep -vE '^server/models/encoder_config\.cc:[0-9]+:    \{core::EncoderSpec::Family::k[A-Za-z]+, ' \
         || true)"
if [[ -n "${found}" ]]; then
  echo "check_family_branches: a branch on the family outside the family table:" >&2
  echo "${found}" >&2
  exit 1
fi
echo "check_family_branches: no branch on the family outside the table"
