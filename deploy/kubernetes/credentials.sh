#!/bin/sh
# The Secrets of a Shoal deployment on Kubernetes (docs/kubernetes.md), written as YAML on stdout:
#   deploy/kubernetes/credentials.sh DIR [NAMESPACE] [NATS_RELEASE] | kubectl apply -f -
# DIR is made by `shoal credentials` (kept if it holds identities already: --keep): one nkey per
# kind of service, the nats-server authorization block (auth.conf), and TLS for the bus: a CA of
# this deployment's own and nats-server's certificate for the names the services and the chart's
# routes reach it by. Two Secrets come out:
#   shoal-credentials  the services' nkeys and ca.pem (each pod mounts only its own kind's key)
#   shoal-nats-tls     nats-server's certificate and key, and the CA (tls.crt, tls.key, ca.crt)
# Keep DIR (ca-key.pem signs again; it goes into no Secret) and pass DIR/auth.conf to helm
# (deploy/kubernetes/nats/values.yaml).
set -eu
dir=${1:?usage: credentials.sh DIR [NAMESPACE] [NATS_RELEASE]}
ns=${2:-shoal}
nats=${3:-nats}
hosts="$nats,$nats.$ns,$nats.$ns.svc,$nats.$ns.svc.cluster.local"
for i in 0 1 2; do
  hosts="$hosts,$nats-$i.$nats-headless,$nats-$i.$nats-headless.$ns.svc.cluster.local"
done
shoal credentials --out "$dir" --keep --tls "$hosts" >&2
kubectl create secret generic shoal-credentials --namespace "$ns" --dry-run=client -o yaml \
  --from-file=gateway.nk="$dir/gateway.nk" --from-file=scheduler.nk="$dir/scheduler.nk" \
  --from-file=worker.nk="$dir/worker.nk" --from-file=instance.nk="$dir/instance.nk" \
  --from-file=repository.nk="$dir/repository.nk" --from-file=operator.nk="$dir/operator.nk" \
  --from-file=ca.pem="$dir/ca.pem"
echo ---
kubectl create secret generic shoal-nats-tls --namespace "$ns" --dry-run=client -o yaml \
  --from-file=tls.crt="$dir/server.pem" --from-file=tls.key="$dir/server-key.pem" --from-file=ca.crt="$dir/ca.pem"
