# frozen_string_literal: true

require "spec_helper"

RSpec.shared_examples "a claimable cell" do |adapter|
  let(:cell) { SpecSupport.cell(adapter, "a") }
  let(:other) { SpecSupport.cell(adapter, "b") }

  it "makes a new user's username and email ACTIVE claims of the cell, with one BeginUpdate and nothing left outstanding" do
    name = unique("alice")
    mail = "#{name}@example.com"
    made = calls { expect(cell.user.create!(username: name, email: mail)).to be_persisted }

    expect(made.count("BeginUpdate")).to eq(1)
    expect(made).to eq(%w[BeginUpdate CommitUpdate])
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "active"])
    expect(lookup(cell, :email, mail)).to eq([cell.cell_id, "active"])
    expect(cell.leases_outstanding).to eq(0)
    expect(cell.client.outstanding_leases).to be_empty
  end

  it "refuses the other cell's save of the same email: save is false with 'has already been taken', create! raises RecordInvalid" do
    mail = "#{unique('taken')}@example.com"
    cell.user.create!(username: unique("first"), email: mail)
    users_before = other.user.count

    late = other.user.new(username: unique("second"), email: mail)
    expect(late.save).to be(false)
    expect(late.errors[:email]).to include("has already been taken")
    expect(late.errors.details[:email]).to include(a_hash_including(error: :taken))
    expect(late).to be_new_record
    expect { other.user.create!(username: unique("third"), email: mail) }
      .to raise_error(ActiveRecord::RecordInvalid, /Email has already been taken/)

    expect(other.user.count).to eq(users_before)
    expect(other.leases_outstanding).to eq(0)
    expect(other.client.outstanding_leases).to be_empty
    expect(lookup(other, :email, mail)).to eq([cell.cell_id, "active"])
  end

  it "deletes a committed lease's row in the next claims transaction: one local COMMIT per save" do
    committer = TopologyClaims::Committer.instance
    committer.drain
    TopologyClaims.clean_up!(cell.connection)
    raw = -> { cell.connection.select_value("SELECT count(*) FROM leases_outstanding").to_i }
    cell.user.create!(username: unique("first"))
    committer.drain # CommitUpdate goes in the background
    expect(raw.call).to eq(1) # committed, its row waits for the next transaction
    statements = []
    subscriber = ActiveSupport::Notifications.subscribe("sql.active_record") do |*, payload|
      statements << payload[:sql]
    end
    begin
      cell.user.create!(username: unique("second"))
    ensure
      ActiveSupport::Notifications.unsubscribe(subscriber)
    end
    committer.drain
    expect(raw.call).to eq(1) # the first row went with the second save, whose row waits
    commits = statements.grep(/\A\s*COMMIT/i)
    expect(commits.size).to eq(1), statements.join("\n")
    deletes = statements.index { |sql| sql.include?("DELETE FROM leases_outstanding") }
    expect(deletes).not_to be_nil
    expect(deletes).to be < statements.index { |sql| sql =~ /\A\s*COMMIT/i }
    TopologyClaims.clean_up!(cell.connection)
    expect(raw.call).to eq(0)
  end

  it "commits inline past max_background_commits (0 here): the claim is active when the save returns" do
    TopologyClaims::Committer.instance.drain
    config = cell.config.dup_with(max_background_commits: 0)
    const = "InlineUser#{adapter.capitalize}"
    SpecSupport.const_set(const, Class.new(cell.user) { claims_configuration config }) unless SpecSupport.const_defined?(const)
    name = unique("inline")
    SpecSupport.const_get(const).create!(username: name)
    expect(TopologyClaims::Committer.instance.queued).to eq(0)
    answer = TopologyClaims.client(config).lookup_claim("usernames", name) # no drain: as it is now
    expect([answer.cell_id, TopologyClaims::Names.short(answer.state)]).to eq([cell.cell_id, "active"])
  end

  it "commits in the background: the save returns at its local COMMIT, and a later save of the same claim waits for that commit" do
    committer = TopologyClaims::Committer.instance
    committer.drain
    gate = Queue.new
    client = cell.client
    client.singleton_class.prepend(Module.new do
      def commit_update(lease_id)
        @spec_gate&.pop
        super
      end
    end)
    client.instance_variable_set(:@spec_gate, gate)
    name = unique("bg")
    user = cell.user.create!(username: name, email: "#{name}@example.com")
    expect(committer.queued).to eq(1) # returned before its CommitUpdate
    # The rename touches the queued claim: it waits for the commit instead of meeting the lease.
    renamer = Thread.new { user.update!(username: "#{name}-2") }
    sleep 0.2
    expect(renamer).to be_alive
    gate << :go << :go
    renamer.join(10)
    expect(renamer.value).to be(true)
    committer.drain
    expect(lookup(cell, :username, "#{name}-2")).to eq([cell.cell_id, "active"])
    expect(lookup(cell, :username, name)).to be_nil
    expect(lookup(cell, :email, "#{name}@example.com")).to eq([cell.cell_id, "active"])
  ensure
    client&.instance_variable_set(:@spec_gate, nil)
  end

  it "puts every refused claim on the form at once: a taken username and a taken email in one save" do
    name = unique("both")
    mail = "#{name}@example.com"
    cell.user.create!(username: name, email: mail)

    late = other.user.new(username: name.upcase, email: mail)
    expect(late.save).to be(false)
    expect(late.errors.details[:username]).to include(a_hash_including(error: :taken, value: name.upcase))
    expect(late.errors.details[:email]).to include(a_hash_including(error: :taken, value: mail))
    expect(late.errors.full_messages).to contain_exactly("Username has already been taken",
                                                         "Email has already been taken")
    error = begin
      other.user.create!(username: name, email: mail)
    rescue TopologyClaims::ClaimsInvalid => e
      e.claims_error
    end
    expect(error).to be_a(TopologyClaims::ClaimTaken)
    expect(error.conflicts.map(&:to_h)).to eq(
      [{ reason: "CLAIM_TAKEN", namespace: "usernames", claim_value: name },
       { reason: "CLAIM_TAKEN", namespace: "emails", claim_value: mail }]
    )
    expect(other.leases_outstanding).to eq(0)
  end

  it "says 'is being changed, try again' for a claim under another cell's lease in progress" do
    name = unique("leased")
    claim = { claim_type: :CLAIM_TYPE_USERNAME, claim_value: name, owner: :OWNER_USER, owner_value: "1",
              table_name: :TABLE_NAME_USERS, table_record_id: 1 }
    lease = cell.client.begin_update(creates: [claim]).lease_payload.lease_id
    user = other.user.new(username: name)
    expect(user.save).to be(false)
    expect(user.errors[:username]).to include("is being changed, try again")
    expect(other.leases_outstanding).to eq(0)
  ensure
    cell.client.rollback_update(lease) if lease
  end

  it "waits inside with_lease_wait for another cell's lease to end, and gets the claim when it rolls back" do
    name = unique("waited")
    claim = { claim_type: :CLAIM_TYPE_USERNAME, claim_value: name, owner: :OWNER_USER, owner_value: "1",
              table_name: :TABLE_NAME_USERS, table_record_id: 1 }
    lease = cell.client.begin_update(creates: [claim]).lease_payload.lease_id
    holder = Thread.new do
      sleep 0.5
      cell.client.rollback_update(lease)
    end
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    user = other.user.new(username: name)
    saved = TopologyClaims.with_lease_wait(3.0) { user.save }
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    holder.join
    lease = nil
    expect(saved).to be(true), user.errors.full_messages.inspect
    expect(took).to be_between(0.45, 2.5)
    expect(lookup(other, :username, name).first).to eq(other.cell_id)
    expect(TopologyClaims.lease_wait).to be_nil
  ensure
    cell.client.rollback_update(lease) if lease
  end

  it "makes exactly one BeginUpdate for two claimable models saved in one transaction" do
    name = unique("two")
    made = calls do
      cell.base.transaction do
        user = cell.user.create!(username: name, email: "#{name}@example.com")
        cell.email.create!(user_id: user.id, email: "#{name}@second.example.com")
      end
    end
    expect(made.count("BeginUpdate")).to eq(1)
    expect(lookup(cell, :email, "#{name}@second.example.com")).to eq([cell.cell_id, "active"])
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "active"])
  end

  it "makes exactly one BeginUpdate for a transaction with a requires_new savepoint, and leaves out a rolled-back savepoint's claims" do
    name = unique("savepoint")
    made = calls do
      cell.base.transaction do
        user = cell.user.create!(username: name)
        cell.base.transaction(requires_new: true) do
          cell.email.create!(user_id: user.id, email: "#{name}@kept.example.com")
        end
        cell.base.transaction(requires_new: true) do
          cell.email.create!(user_id: user.id, email: "#{name}@dropped.example.com")
          raise ActiveRecord::Rollback
        end
      end
    end
    expect(made.count("BeginUpdate")).to eq(1)
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "active"])
    expect(lookup(cell, :email, "#{name}@kept.example.com")).to eq([cell.cell_id, "active"])
    expect(lookup(cell, :email, "#{name}@dropped.example.com")).to be_nil
  end

  it "frees the claims of a transaction ended by raise ActiveRecord::Rollback" do
    name = unique("rolledback")
    made = calls do
      cell.base.transaction do
        cell.user.create!(username: name, email: "#{name}@example.com")
        raise ActiveRecord::Rollback
      end
    end
    expect(made).to be_empty
    expect(cell.user.where(username: name)).to be_empty
    expect(lookup(cell, :username, name)).to be_nil
    expect(other.user.create!(username: name, email: "#{name}@example.com")).to be_persisted
    expect(lookup(other, :username, name)).to eq([other.cell_id, "active"])
  end

  it "frees the old email and claims the new one in one lease when the email changes" do
    name = unique("mover")
    user = cell.user.create!(username: name, email: "#{name}@old.example.com")
    made = calls { user.update!(email: "#{name}@new.example.com") }
    expect(made).to eq(%w[BeginUpdate CommitUpdate])
    expect(lookup(cell, :email, "#{name}@old.example.com")).to be_nil
    expect(lookup(cell, :email, "#{name}@new.example.com")).to eq([cell.cell_id, "active"])
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "active"])
  end

  it "moves a claim to another record in place (updates_claims), never freeing it" do
    name = unique("moved")
    first = cell.user.create!(username: unique("owner1"))
    second = cell.user.create!(username: unique("owner2"))
    address = cell.email.create!(user_id: first.id, email: "#{name}@example.com")
    made = calls { address.update!(user_id: second.id) }
    expect(made).to eq(%w[BeginUpdate CommitUpdate])
    info = cell.client.lookup_claim(:email, "#{name}@example.com").claim
    expect(info.owner_value).to eq(second.id.to_s)
  end

  it "makes no call for a save that changes no claimed attribute" do
    user = cell.user.create!(username: unique("quiet"))
    expect(calls { user.update!(updated_at: Time.now + 60) }).to be_empty
  end

  it "frees the claims on destroy" do
    name = unique("leaving")
    user = cell.user.create!(username: name, email: "#{name}@example.com")
    made = calls { user.destroy }
    expect(made).to eq(%w[BeginUpdate CommitUpdate])
    expect(lookup(cell, :username, name)).to be_nil
    expect(lookup(cell, :email, "#{name}@example.com")).to be_nil
  end

  it "raises TopologyClaims::Unavailable and writes nothing when the service is unreachable" do
    closed_port = TCPServer.open("127.0.0.1", 0).then { |s| s.addr[1].tap { s.close } }
    config = cell.config.dup_with(address: "http://127.0.0.1:#{closed_port}", breaker_failures: 0)
    model = Class.new(cell.user) { claims_configuration config }
    SpecSupport.const_set("UnreachableUser#{adapter.capitalize}", model) unless SpecSupport.const_defined?("UnreachableUser#{adapter.capitalize}")
    name = unique("unreachable")
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    expect { model.create!(username: name) }.to raise_error(TopologyClaims::Unavailable, /127\.0\.0\.1:#{closed_port}/)
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 5
    expect(cell.user.where(username: name)).to be_empty
    expect(cell.leases_outstanding).to eq(0)
  end

  it "opens the breaker after breaker_failures failed saves: a save's clean-up rollback is no extra strike" do
    closed_port = TCPServer.open("127.0.0.1", 0).then { |s| s.addr[1].tap { s.close } }
    config = cell.config.dup_with(address: "http://127.0.0.1:#{closed_port}", breaker_failures: 2,
                                  breaker_cooldown: 60, max_attempts: 1)
    model = Class.new(cell.user) { claims_configuration config }
    SpecSupport.const_set("BreakerUser#{adapter.capitalize}", model) unless SpecSupport.const_defined?("BreakerUser#{adapter.capitalize}")
    2.times do # Unavailable itself: CircuitOpen is one too
      expect { model.create!(username: unique("strike")) }
        .to raise_error { |e| expect(e.class).to eq(TopologyClaims::Unavailable) }
    end
    expect { model.create!(username: unique("open")) }.to raise_error(TopologyClaims::CircuitOpen, /2 consecutive/)
  end

  it "logs and counts a CommitUpdate that fails after COMMIT, never raises it, and leaves the lease to reconcile" do
    name = unique("uncommitted")
    allow(cell.client).to receive(:commit_update).and_raise(TopologyClaims::Unavailable.new("CommitUpdate: down"))
    before = TopologyClaims.metrics.get(:commit_failures)
    expect(cell.user.create!(username: name)).to be_persisted
    TopologyClaims::Committer.instance.drain
    expect(TopologyClaims.metrics.get(:commit_failures)).to eq(before + 1)
    expect(cell.leases_outstanding).to eq(1)
    RSpec::Mocks.space.proxy_for(cell.client).reset

    _stdout, stderr, status = sidecar(cell, "reconcile", "--once")
    expect(status).to be_success, stderr
    expect(lookup(cell, :username, name)).to eq([cell.cell_id, "active"])
    expect(cell.leases_outstanding).to eq(0)
  end

  it "refuses the COMMIT past the staleness guard (staleness - safety_margin) and rolls the lease back" do
    config = cell.config.dup_with(staleness: 0.000001, safety_margin: 0.0)
    const = "StaleUser#{adapter.capitalize}"
    SpecSupport.const_set(const, Class.new(cell.user) { claims_configuration config }) unless SpecSupport.const_defined?(const)
    name = unique("stale")
    expect { SpecSupport.const_get(const).create!(username: name) }
      .to raise_error(TopologyClaims::StaleLease, /commit window/)
    expect(cell.user.where(username: name)).to be_empty
    expect(cell.leases_outstanding).to eq(0)
    expect(lookup(cell, :username, name)).to be_nil
  end

  it "saves without calls when TopologyClaims.disable! is set" do
    TopologyClaims.disable!
    made = calls { cell.user.create!(username: unique("disabled")) }
    expect(made).to be_empty
  ensure
    TopologyClaims.enable!
  end
end

RSpec.describe TopologyClaims::Claimable do
  describe "namespaces" do
    let(:cell) { SpecSupport.cell(:sqlite, "a") }

    it "claims in the namespace the model names, found by namespace or by the legacy type" do
      name = unique("nsuser")
      cell.user.create!(username: name, email: "#{name}@example.com")
      expect(cell.client.lookup_claim("usernames", name).cell_id).to eq(cell.cell_id)
      expect(cell.client.lookup_claim(:username, name).cell_id).to eq(cell.cell_id)
      expect(cell.client.lookup_claim("emails", "#{name}@example.com").claim.namespace).to eq("emails")
    end

    it "fails the first save of a model naming an unknown namespace with an error naming the model and the namespace" do
      model = Class.new(cell.base) do
        self.table_name = "users"
        include TopologyClaims::Claimable
        claims_owner :user
        claims_table :users
        claim :username, namespace: "no-such-namespace"
      end
      model.claims_configuration(cell.config)
      Cells.const_set(:"UnknownNamespaceUser#{SecureRandom.hex(4)}", model)
      users_before = cell.user.count

      expect { model.create!(username: unique("lost"), email: "x@example.com") }
        .to raise_error(TopologyClaims::UnknownNamespace) { |e|
          expect(e.message).to match(/UnknownNamespaceUser\h+#username: .*"no-such-namespace"/)
          expect(e.namespace).to eq("no-such-namespace")
        }
      expect(cell.user.count).to eq(users_before)
      expect(cell.leases_outstanding).to eq(0)
    end

    it "claims in a namespace an administrator created, under its rules, shown as the cell sent it" do
      namespace = "pages-domains-#{SecureRandom.hex(3)}"
      _, err, status = TopologyClaims::Testing.run(
        "admin", "--server", SpecSupport.server.url, "namespaces", "create", namespace,
        "--normalization", "ascii-case-insensitive", "--pattern", "^[a-z0-9.-]+$", "--reason", "spec"
      )
      expect(status).to be_success, err
      other = SpecSupport.cell(:sqlite, "b")
      domains = [cell, other].map do |c|
        model = Class.new(c.base) do
          self.table_name = "users"
          include TopologyClaims::Claimable
          claims_owner :user
          claims_table :users
          claim :username, namespace: namespace
        end
        model.claims_configuration(c.config)
        Cells.const_set(:"PagesDomain#{SecureRandom.hex(4)}", model)
        model
      end
      site = "Docs-#{SecureRandom.hex(3)}.Example.COM"
      domains[0].create!(username: site, email: "x@example.com")
      found = cell.client.lookup_claim(namespace, site.downcase)
      expect(found.cell_id).to eq(cell.cell_id)
      expect(found.claim.claim_value).to eq(site)
      expect(found.claim.claim_key).to eq(site.downcase)

      late = domains[1].new(username: site.upcase, email: "y@example.com")
      expect(late.save).to be(false)
      expect(late.errors[:username]).to include("has already been taken")
      bad = domains[1].new(username: "not_a_domain", email: "z@example.com")
      expect(bad.save).to be(false)
      expect(bad.errors[:username].join).to match(/pattern/)
    end

    it "lists the server's namespaces, the built-ins and those an administrator created" do
      namespaces = TopologyClaims.namespaces(cell.config)
      builtins = namespaces.select { |n| %w[routes usernames emails].include?(n.id) }
      expect(builtins.map(&:normalization).uniq).to eq([:NORMALIZATION_PRECIS_USERNAME])
      expect(builtins.map(&:id)).to contain_exactly("routes", "usernames", "emails")
      expect(namespaces.map(&:id)).to eq(namespaces.map(&:id).sort)
    end

    it "files claims under any owner type and source table, listed and verified by that table" do
      keys = Class.new(cell.base) do
        self.table_name = "users"
        include TopologyClaims::Claimable
        claims_owner :organization, value: :email
        claims_table :ssh_keys
        claim :username, namespace: "routes"
      end
      keys.claims_configuration(cell.config)
      Cells.const_set(:"SshKey#{SecureRandom.hex(4)}", keys)
      fingerprint = "sha256-#{SecureRandom.hex(6)}"
      key = keys.create!(username: fingerprint, email: "org-#{fingerprint}@example.com")

      found = cell.client.lookup_claim("routes", fingerprint).claim
      expect([found.owner_type_name, found.owner_value]).to eq(["organization", key.email])
      expect([found.source_table, found.table_name, found.table_record_id]).to eq(["ssh_keys", :TABLE_NAME_UNSPECIFIED, key.id])
      listed = cell.client.claims_of(:ssh_keys)
      expect(listed.map(&:claim_value)).to include(fingerprint)
      expect(listed.map(&:source_table).uniq).to eq(["ssh_keys"])
      expect(cell.client.claims_of(:users).map(&:claim_value)).not_to include(fingerprint)
      toml = TopologyClaims.verify_toml(cell.base.connection, models: [keys])
      expect(toml).to start_with("[tables.ssh_keys]")
      expect(toml).to include("'organization'")

      key.update!(username: "#{fingerprint}-2")
      expect(cell.client.lookup_claim("routes", "#{fingerprint}-2").claim.source_table).to eq("ssh_keys")
    end

    it "leaves the owner type's and table's shape to the server: a bad one fails the first save, naming the field" do
      bad = Class.new(cell.base) do
        self.table_name = "users"
        include TopologyClaims::Claimable
        claims_owner :user
        claims_table "SSH Keys"
        claim :username, namespace: "usernames"
      end
      bad.claims_configuration(cell.config)
      Cells.const_set(:"BadTable#{SecureRandom.hex(4)}", bad)
      name = unique("badtable")
      expect { bad.create!(username: name) }
        .to raise_error(TopologyClaims::InvalidRequest, /source_table/)
      expect(cell.user.where(username: name)).to be_empty
      expect(cell.leases_outstanding).to eq(0)
    end

    it "answers update like save: false and the error on the form; update! raises RecordInvalid" do
      other = SpecSupport.cell(:sqlite, "b")
      taken = "#{unique('held')}@a.example"
      cell.user.create!(username: unique("carol"), email: taken)
      bob = other.user.create!(username: unique("bob"), email: "#{unique('bob')}@b.example")
      expect(bob.update(email: taken)).to be(false)
      expect(bob.errors[:email]).to include("has already been taken")
      expect(bob.reload.email).not_to eq(taken)
      expect { bob.update!(email: taken) }.to raise_error(ActiveRecord::RecordInvalid, /Email has already been taken/)
      expect(bob.update_attribute(:email, taken)).to be(false)
      expect(bob.errors[:email]).to include("has already been taken")
      expect(other.leases_outstanding).to eq(0)
      free = "#{unique('free')}@b.example"
      expect(bob.update(email: free)).to be(true)
      expect(lookup(other, :email, free)).to eq([other.cell_id, "active"])
    end

    it "raises instead of writing an empty verify.toml when no claimable model is loaded" do
      plain = Class.new(cell.base) { self.table_name = "users" }
      expect { TopologyClaims.verify_toml(cell.base.connection, models: [plain]) }
        .to raise_error(TopologyClaims::ConfigurationError, /no claimable model is loaded.*eager_load!/)
    end

    it "refuses a declaration with both namespace: and type:, or neither" do
      expect { Class.new(cell.base) { include TopologyClaims::Claimable; claim :x, namespace: "emails", type: :email } }
        .to raise_error(ArgumentError, /namespace: .*not both/)
      expect { Class.new(cell.base) { include TopologyClaims::Claimable; claim :x } }
        .to raise_error(ArgumentError, /namespace:/)
    end
  end

  context "on SQLite" do
    it_behaves_like "a claimable cell", :sqlite
  end

  context "on PostgreSQL" do
    it_behaves_like "a claimable cell", :postgresql
  end
end
