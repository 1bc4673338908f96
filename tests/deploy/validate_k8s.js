// Validates Kubernetes objects (a JSON array from `kubectl kustomize`) against the API
// schemas shipped by the npm packages kubernetes-models and
// @kubernetes-models/prometheus-operator. Prints one line per object; exits 1 on the
// first schema violation (with its message) or an unknown kind.
//
// usage: node validate_k8s.js OBJECTS.json NODE_MODULES_DIR
"use strict";
const fs = require("fs");
const path = require("path");

const objectsFile = process.argv[2];
const nodeModules = path.resolve(process.argv[3]);
const objects = JSON.parse(fs.readFileSync(objectsFile, "utf8"));

function modelClass(apiVersion, kind) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "monitoring.coreos.com") {
    return require(path.join(nodeModules, "@kubernetes-models/prometheus-operator",
                             group, version, kind))[kind];
  }
  // Core objects live at the top level; other groups under their short group name
  // ("apps", "policy", "autoscaling").
  const dir = group === "" ? version : path.join(group, version);
  return require(path.join(nodeModules, "kubernetes-models", dir, kind))[kind];
}

let failed = 0;
for (const object of objects) {
  const name = `${object.kind}/${object.metadata && object.metadata.name}`;
  let Model;
  try {
    Model = modelClass(object.apiVersion, object.kind);
  } catch (error) {
    console.log(`FAIL ${name}: no schema for ${object.apiVersion} ${object.kind}`);
    failed++;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`ok   ${name} (${object.apiVersion})`);
  } catch (error) {
    console.log(`FAIL ${name}: ${error.message}`);
    failed++;
  }
}
process.exit(failed === 0 ? 0 : 1);
