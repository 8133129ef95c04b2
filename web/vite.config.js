// Builds the dashboard into dist/, which is committed and built into the cairn binary
// (crates/cairn-rest/src/dashboard.rs). File names carry no content hash, so the binary serves
// a fixed set of paths; scripts/test rebuilds dist/ and fails if it differs from the commit.
import { defineConfig } from 'vite';

export default defineConfig({
  base: './',
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    assetsDir: 'assets',
    sourcemap: false,
    modulePreload: { polyfill: false },
    rolldownOptions: {
      output: {
        entryFileNames: 'assets/app.js',
        chunkFileNames: 'assets/[name].js',
        assetFileNames: 'assets/[name][extname]',
      },
    },
  },
});
