// Validates Kubernetes manifests (multi-document YAML, e.g. the output of
// `kubectl kustomize`) against the API schemas that kubernetes-models carries,
// offline. Every document must be of a kind this tool knows (the core API,
// cert-manager, the Prometheus Operator); an unknown kind is an error, not a
// pass. Reads the files given, or stdin. Exit 0 when all are valid, 1 when
// any is not (each problem printed as kind/name: path: message).
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const sources = process.argv.slice(2);
const texts = sources.length ? sources.map((f) => [f, readFileSync(f, "utf8")])
                             : [["<stdin>", readFileSync(0, "utf8")]];

// apiVersion -> module prefix holding one module per kind.
function modulePath(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "monitoring.coreos.com") {
    return `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`;
  }
  if (group === "cert-manager.io") return `@kubernetes-models/cert-manager/${group}/${version}/${kind}`;
  if (group === "") return `kubernetes-models/${version}/${kind}`;
  return `kubernetes-models/${group}/${version}/${kind}`;
}

let problems = 0;
let count = 0;
for (const [source, text] of texts) {
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length) {
      console.error(`${source}: YAML: ${doc.errors[0].message}`);
      problems++;
      continue;
    }
    const obj = doc.toJS();
    if (obj === null) continue;
    count++;
    const where = `${obj.kind ?? "?"}/${obj.metadata?.name ?? "?"}`;
    if (!obj.apiVersion || !obj.kind) {
      console.error(`${source}: ${where}: apiVersion and kind are required`);
      problems++;
      continue;
    }
    let Model;
    try {
      Model = (await import(modulePath(obj.apiVersion, obj.kind)))[obj.kind];
    } catch {
      Model = undefined;
    }
    if (!Model) {
      console.error(`${source}: ${where}: no schema for ${obj.apiVersion} ${obj.kind}`);
      problems++;
      continue;
    }
    try {
      new Model(obj).validate();
    } catch (e) {
      const details = (e.errors ?? []).map((x) => `${x.instancePath || "/"}: ${x.message}`);
      console.error(`${source}: ${where}: ${details.length ? details.join("; ") : e.message}`);
      problems++;
    }
  }
}
console.log(`k8s-validate: ${count} objects, ${problems} problems`);
process.exit(problems ? 1 : 0);
