#!/usr/bin/env bash
# Installs Loom as systemd services on this host: the binaries, the units, their
# environment files (kept if present, so an upgrade never loses settings), the
# dedicated user, and the Prometheus rules and Grafana dashboard with their
# provisioning. Enable afterwards with
#   systemctl enable --now loom-coordinator   (one host)
#   systemctl enable --now loom-worker        (every training host)
# Usage: deploy/systemd/install.sh [--bin_dir=build/bin] [--prefix=/usr/local] [--root=/]
#   --root installs every file beneath another root (packaging, tests); the
#   binaries go to ROOT/PREFIX/bin and the units run PREFIX/bin.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
bin_dir=$repo/build/bin
prefix=/usr/local
root=/
for arg in "$@"; do
  case "$arg" in
    --bin_dir=*) bin_dir=${arg#*=} ;;
    --prefix=*) prefix=${arg#*=} ;;
    --root=*) root=${arg#*=} ;;
    *) echo "usage: $0 [--bin_dir=DIR] [--prefix=DIR] [--root=DIR] (unknown: $arg)" >&2; exit 2 ;;
  esac
done
root=${root%/}

for b in loom-coordinator loom-worker loom-trainer loomctl; do
  [ -x "$bin_dir/$b" ] || { echo "install.sh: $bin_dir/$b missing: build first (scripts/build.sh)" >&2; exit 1; }
done
install -d "$root$prefix/bin"
for b in loom-coordinator loom-worker loom-trainer loomctl; do
  install -m 0755 "$bin_dir/$b" "$root$prefix/bin/$b"
done

install -d "$root/etc/systemd/system" "$root/etc/loom" "$root/usr/lib/sysusers.d"
for unit in loom-coordinator.service loom-worker.service; do
  sed "s#/usr/local/bin/#$prefix/bin/#" "$here/$unit" > "$root/etc/systemd/system/$unit"
  chmod 0644 "$root/etc/systemd/system/$unit"
done
for env in coordinator.env worker.env; do
  [ -e "$root/etc/loom/$env" ] || install -m 0644 "$here/$env" "$root/etc/loom/$env"
done
install -m 0644 "$here/loom.sysusers.conf" "$root/usr/lib/sysusers.d/loom.conf"

# Prometheus (Debian's package reads /etc/prometheus/prometheus.yml: add the
# scrape job and rule_files of deploy/prometheus/prometheus.yml there).
install -d "$root/etc/prometheus/loom"
install -m 0644 "$repo/deploy/prometheus/rules/loom.rules.yml" "$root/etc/prometheus/loom/"
[ -e "$root/etc/prometheus/loom/loom-site.rules.yml" ] ||
  install -m 0644 "$repo/deploy/prometheus/rules/loom-site.rules.yml" "$root/etc/prometheus/loom/"
# Grafana: the dashboard, its file provider and the Prometheus data source.
install -d "$root/etc/grafana/provisioning/dashboards" "$root/etc/grafana/provisioning/datasources" \
  "$root/var/lib/grafana/dashboards/loom"
install -m 0644 "$repo/deploy/grafana/provisioning.yaml" "$root/etc/grafana/provisioning/dashboards/loom.yaml"
[ -e "$root/etc/grafana/provisioning/datasources/loom.yaml" ] ||
  install -m 0644 "$repo/deploy/grafana/datasource.yaml" "$root/etc/grafana/provisioning/datasources/loom.yaml"
install -m 0644 "$repo/deploy/grafana/loom-dashboard.json" "$root/var/lib/grafana/dashboards/loom/"

if [ "$root" = "" ]; then
  if command -v systemd-sysusers > /dev/null; then
    systemd-sysusers /usr/lib/sysusers.d/loom.conf
  elif ! id loom > /dev/null 2>&1; then
    useradd --system --home-dir /var/lib/loom --shell /usr/sbin/nologin loom
  fi
  if [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
  echo "installed; certificates go to /etc/loom/tls/{coordinator,node} (docs/operations.md)"
fi
