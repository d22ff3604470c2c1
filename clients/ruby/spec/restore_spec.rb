# frozen_string_literal: true

require "spec_helper"

# After `topology-claims admin mark-restored`, a save whose claim does not exist is refused with
# RESTORE_QUARANTINE, which the concern turns into a validation error; once the quarantine is
# lifted the same save goes through. Its own server: a quarantine would stop every other spec.
RSpec.describe "a claims store restored from a backup" do
  let(:server) { TopologyClaims::Testing::Server.start }
  let(:cell) do
    Cells.build(adapter: :sqlite, name: "restored", cell_id: "rb-restored-#{SpecSupport.run_id}",
                database: File.join(SpecSupport::TMP, "cell-restored.sqlite3"), address: server.url)
  end

  after { server.stop }

  def admin(*args)
    out, err, status = TopologyClaims::Testing.run("admin", "--server", server.url, *args)
    raise "admin #{args.first} failed: #{err}" unless status.success?

    out
  end

  it "turns RESTORE_QUARANTINE into 'cannot be claimed right now' until the quarantine is lifted" do
    cell.user.create!(username: unique("before"))
    status = admin("mark-restored", "--backup-time", (Time.now.utc - 3600).strftime("%FT%TZ"),
                   "--reason", "ruby spec", "--yes")
    expect(status).to include("restore epoch:   1")

    name = unique("new")
    user = cell.user.new(username: name)
    expect(user.save).to be(false)
    expect(user.errors.details[:username]).to include(a_hash_including(error: :restore_quarantine))
    expect(user.errors[:username].first).to match(/cannot be claimed right now/)
    expect(cell.leases_outstanding).to eq(0)

    admin("lift-quarantine", "--epoch", "1", "--reason", "ruby spec", "--yes")
    expect(cell.user.create!(username: name)).to be_persisted
  end
end
