// A .zip of files, stored without compression (safetensors weights barely compress): what the
// page's "Download as Hugging Face" writes, which unzip, Python's zipfile and every OS open.

const CRC_TABLE = new Uint32Array(256).map((_, n) => {
  let c = n;
  for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
  return c >>> 0;
});

/** CRC-32 (the zip format's, IEEE 802.3) of `bytes`. */
export function crc32(bytes) {
  let c = 0xffffffff;
  for (const b of bytes) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** The bytes of a .zip holding `files`, an array of `[name, Uint8Array]` (each under 4 GiB,
 * fewer than 65,536 of them: no zip64). */
export function zip(files) {
  const encoder = new TextEncoder();
  const local = [];
  const central = [];
  let offset = 0;
  for (const [name, data] of files) {
    const path = encoder.encode(name);
    const crc = crc32(data);
    // Version 2.0, UTF-8 names (flag bit 11), stored (method 0), no time (1980-01-01).
    const fields = (header, signature) => {
      const v = new DataView(header.buffer);
      v.setUint32(0, signature, true);
      return v;
    };
    const head = new Uint8Array(30 + path.length);
    const h = fields(head, 0x04034b50);
    h.setUint16(4, 20, true);
    h.setUint16(6, 0x0800, true);
    h.setUint16(12, 0x21, true);
    h.setUint32(14, crc, true);
    h.setUint32(18, data.length, true);
    h.setUint32(22, data.length, true);
    h.setUint16(26, path.length, true);
    head.set(path, 30);
    local.push(head, data);

    const entry = new Uint8Array(46 + path.length);
    const e = fields(entry, 0x02014b50);
    e.setUint16(4, 20, true);
    e.setUint16(6, 20, true);
    e.setUint16(8, 0x0800, true);
    e.setUint16(14, 0x21, true);
    e.setUint32(16, crc, true);
    e.setUint32(20, data.length, true);
    e.setUint32(24, data.length, true);
    e.setUint16(28, path.length, true);
    e.setUint32(42, offset, true);
    entry.set(path, 46);
    central.push(entry);
    offset += head.length + data.length;
  }
  const size = central.reduce((n, c) => n + c.length, 0);
  const end = new Uint8Array(22);
  const v = new DataView(end.buffer);
  v.setUint32(0, 0x06054b50, true);
  v.setUint16(8, files.length, true);
  v.setUint16(10, files.length, true);
  v.setUint32(12, size, true);
  v.setUint32(16, offset, true);
  return new Blob([...local, ...central, end]);
}
