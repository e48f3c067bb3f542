// Shared device setup for both hosts: adapter -> device with the adapter's limits.

import { Engine } from "./gpu.js";

export interface DeviceSetup {
  engine: Engine;
  device: { [k: string]: string | number };
}

function describe(adapter: GPUAdapter, backend: string): { [k: string]: string | number } {
  const info = adapter.info;
  const text = `${info.vendor} ${info.architecture} ${info.device} ${info.description}`.trim();
  const cpu = /llvmpipe|lavapipe|swiftshader|softpipe/i.test(text);
  return {
    name: info.description || info.device || info.vendor || "unknown",
    type: cpu ? "cpu" : "gpu",
    backend,
    vendor: info.vendor,
    architecture: info.architecture,
  };
}

export async function adapterNames(
  gpu: GPU,
  options: GPURequestAdapterOptions[],
): Promise<string[]> {
  const out: string[] = [];
  for (const o of options) {
    const a = await gpu.requestAdapter(o);
    if (a) out.push(`${a.info.description || a.info.device} (${a.info.vendor})`);
  }
  return out;
}

export async function setupDevice(adapter: GPUAdapter, backend: string): Promise<DeviceSetup> {
  const al = adapter.limits;
  const requiredLimits: Record<string, number> = {
    maxStorageBufferBindingSize: al.maxStorageBufferBindingSize,
    maxBufferSize: al.maxBufferSize,
    maxStorageBuffersPerShaderStage: Math.min(al.maxStorageBuffersPerShaderStage, 8),
    maxComputeWorkgroupsPerDimension: al.maxComputeWorkgroupsPerDimension,
  };
  if (al.maxStorageBuffersPerShaderStage < 7) {
    throw new Error(
      `the adapter offers ${al.maxStorageBuffersPerShaderStage} storage buffers per shader stage; the kernels need 7`,
    );
  }
  const device = await adapter.requestDevice({ requiredLimits });
  const desc = describe(adapter, backend);
  const engine = new Engine(device, {
    name: String(desc.name),
    type: String(desc.type),
    backend,
    vendor: String(desc.vendor),
  });
  return { engine, device: desc };
}
