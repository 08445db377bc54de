#!/usr/bin/env bash
# Fashion-MNIST's four IDX files (gzipped, 30 MB) into DIR (default data/fashion-mnist), for
# `reproduce/train.py --preset=fmnist.* --data=DIR`. They come from Debian's package
# dataset-fashion-mnist (apt-get download: no root, no installation), else from the data set's
# own repository; either way each file's SHA-256 is checked.
#
#   bash reproduce/data/fashion_mnist.sh [DIR]
set -euo pipefail
dir=${1:-data/fashion-mnist}
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
names="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"
if (cd "$tmp" && apt-get download dataset-fashion-mnist >/dev/null 2>&1); then
  dpkg-deb -x "$tmp"/dataset-fashion-mnist_*.deb "$tmp/deb"
  cp "$tmp"/deb/usr/share/datasets/fashion-mnist/*-ubyte.gz "$dir"/
else
  url=http://fashion-mnist.s3-website.eu-central-1.amazonaws.com
  for n in $names; do curl -fsSL -o "$dir/$n.gz" "$url/$n.gz"; done
fi
(cd "$dir" && sha256sum -c --quiet) <<'SUMS'
b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7  train-images-idx3-ubyte.gz
0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056  train-labels-idx1-ubyte.gz
cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa  t10k-images-idx3-ubyte.gz
8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05  t10k-labels-idx1-ubyte.gz
SUMS
echo "Fashion-MNIST in $dir"
