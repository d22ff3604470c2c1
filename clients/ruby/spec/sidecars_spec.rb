# frozen_string_literal: true

require "spec_helper"

RSpec.shared_examples "a cell verified with verify_toml" do |adapter|
  let(:cell) { SpecSupport.cell(adapter, "verified") }

  it "finds nothing on a clean database, and destroys the claims of a user row deleted behind the gem's back" do
    kept = cell.user.create!(username: unique("kept"), email: "#{unique('kept')}@example.com")
    gone = cell.user.create!(username: unique("gone"), email: "#{unique('gone')}@example.com")
    cell.email.create!(user_id: kept.id, email: "#{unique('extra')}@example.com")
    source = File.join(SpecSupport::TMP, "verify-#{adapter}.toml")
    File.write(source, TopologyClaims.verify_toml(cell.connection, models: [cell.user, cell.email]))
    verify = lambda do
      sidecar(cell, "verify", "--source", source, "--recent", "0s",
              "--cursor-file", File.join(SpecSupport::TMP, "cursor-#{adapter}-#{SecureRandom.hex(3)}"))
    end

    stdout, stderr, status = verify.call
    expect(status).to be_success, stderr
    expect(stdout).to match(/ missing=0 different=0 extra=0 /), stdout

    cell.user.where(id: gone.id).delete_all # behind the gem's back: no callbacks, no lease
    stdout, stderr, status = verify.call
    expect(status).to be_success, stderr
    expect(lookup(cell, :username, gone.username)).to be_nil
    expect(lookup(cell, :email, gone.email)).to be_nil
    expect(lookup(cell, :username, kept.username)).to eq([cell.cell_id, "active"])
    expect(stdout).not_to be_empty
  end
end

RSpec.describe "the sidecars against the gem's tables" do
  context "on SQLite" do
    it_behaves_like "a cell verified with verify_toml", :sqlite
  end

  context "on PostgreSQL" do
    it_behaves_like "a cell verified with verify_toml", :postgresql
  end
end
