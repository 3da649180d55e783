# Sourced by recipes/*/run.sh after their option defaults, as Kaldi's utils/parse_options.sh:
#   --name value | --name=value   sets the shell variable `name` (dashes become underscores);
#   the variable must already have a default in run.sh, so a typo is an error, not a new variable.
#   --help prints the options with their current values (the run.sh header comment comes first).
# Values are assigned with printf -v: nothing from the command line is ever evaluated.
# shellcheck shell=bash

_po_usage() {
  sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
  echo "Options (current values):"
  for _po_name in "${recipe_options[@]}"; do
    printf '  --%-22s %s\n' "$_po_name" "${!_po_name}"
  done
}

while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) _po_usage; exit 0 ;;
    --*=*) _po_name="${1%%=*}"; _po_value="${1#*=}"; shift ;;
    --*)
      if [ $# -lt 2 ]; then echo "$0: option $1 needs a value" >&2; exit 2; fi
      _po_name="$1"; _po_value="$2"; shift 2 ;;
    *) echo "$0: unexpected argument '$1' (options are --name value; see --help)" >&2; exit 2 ;;
  esac
  _po_name="${_po_name#--}"; _po_name="${_po_name//-/_}"
  _po_known=false
  for _po_opt in "${recipe_options[@]}"; do [ "$_po_opt" = "$_po_name" ] && _po_known=true; done
  if ! $_po_known; then
    echo "$0: unknown option --$_po_name. Known options: ${recipe_options[*]/#/--}" >&2; exit 2
  fi
  printf -v "$_po_name" '%s' "$_po_value"
done
unset _po_name _po_value _po_known _po_opt
