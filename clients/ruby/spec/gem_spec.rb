# frozen_string_literal: true

require "spec_helper"
require "open3"
require "rubygems/package"

RSpec.describe "the gem as Bundler sees it" do
  it "builds the same files from any directory, and its name loads the library" do
    out = File.join(SpecSupport::TMP, "gem-build-#{Process.pid}")
    FileUtils.mkdir_p(out)
    gemspec = File.join(SpecSupport::ROOT, "topology-claims.gemspec")
    # Built from another directory than the gem's own.
    _, err, status = Open3.capture3("gem", "build", gemspec, "--output", File.join(out, "g.gem"), chdir: out)
    expect(status).to be_success, err
    files = Gem::Package.new(File.join(out, "g.gem")).spec.files
    expected = Dir.chdir(SpecSupport::ROOT) { Dir["lib/**/*.{rb,yml,rake}"] }
    expect(files.grep(%r{\Alib/})).to match_array(expected)
    expect(files).to include("lib/topology-claims.rb", "lib/topology_claims.rb")

    # Bundler loads a path gem's gemspec inside a chdir block of its own: no "conflicting
    # chdir" warning on every `bin/rails` command.
    _, err, status = Open3.capture3(
      RbConfig.ruby, "-e", "Dir.chdir(ARGV[0]) { Gem::Specification.load(ARGV[1]) or abort 'not loaded' }",
      SpecSupport::ROOT, gemspec
    )
    expect(status).to be_success, err
    expect(err).not_to include("chdir")

    # `gem "topology-claims"` requires "topology-claims": the module and its configure exist.
    loaded, err, status = Open3.capture3(
      RbConfig.ruby, "-I", File.join(SpecSupport::ROOT, "lib"), "-e",
      'require "topology-claims"; print TopologyClaims.respond_to?(:configure)'
    )
    expect(status).to be_success, err
    expect(loaded).to eq("true")
  end
end
